"""What every API view shares: the one error shape, the JSON parser and cursor pagination. Apps'
api/ packages build on these; none re-implements them. Who the caller is lives in todos/auth.py:
this package imports no app."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import Resolver404, resolve, reverse
from django.utils.dateparse import parse_datetime
from django.utils.deprecation import MiddlewareMixin
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.utils import encoders

from switchboard import dberrors
from switchboard.errors import ApplicationError
from switchboard.logs import redact_tokens

logger = logging.getLogger(__name__)

# code -> HTTP status. Every ApplicationError (the queue's, ingest's) carries a code; this is the one
# place that turns a code into a status.
STATUS_BY_CODE = {
    "invalid": 400,
    "queue_limit": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "spawn_limit": 409,
    "superseded": 409,
    "too_large": 413,
    "throttled": 429,
    "unavailable": 503,
    "timeout": 503,
}


# Every value that can reach SQL is checked where it comes in (a NUL byte, a range); this is the net
# under those checks, for one that was missed: 400, never a 500.
REFUSED_VALUE = "A value in the request cannot be stored or compared (a NUL byte, or a number or time out of range)."


def error_body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "detail": detail, **extra}}


def _drf_code(exc: exceptions.APIException) -> str:
    if isinstance(exc, exceptions.ValidationError | exceptions.ParseError | exceptions.UnsupportedMediaType):
        return "invalid"
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        return "unauthorized"
    if isinstance(exc, exceptions.NotFound):
        return "not_found"
    if isinstance(exc, exceptions.PermissionDenied):
        return "forbidden"
    if isinstance(exc, exceptions.MethodNotAllowed):
        return "method_not_allowed"
    if isinstance(exc, exceptions.Throttled):
        return "throttled"
    return "invalid"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render every error as ``{"error": {"code", "detail", ...}}`` (SPEC "Interfaces")."""
    # Imported here: rest_framework.views reads the auth classes from settings at import time, and
    # they live in this module, so a top-level import would be circular.
    from rest_framework.views import set_rollback

    set_rollback()
    if isinstance(exc, ApplicationError):
        # A refusal that passes with time (a budget) says when to come back, in the header too.
        retry = {"Retry-After": str(exc.extra["retry_after"])} if "retry_after" in exc.extra else None
        return Response(error_body(exc.code, exc.detail, **exc.extra), status=STATUS_BY_CODE[exc.code], headers=retry)
    if isinstance(exc, DatabaseError) and (answer := dberrors.error_answer(exc)):
        code, detail = answer
        return Response(error_body(code, detail), status=STATUS_BY_CODE[code], headers={"Retry-After": "1"})
    if isinstance(exc, DatabaseError) and dberrors.refused_value(exc):
        return Response(error_body("invalid", REFUSED_VALUE), status=400)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("too_large", "The request body is too large."), status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if isinstance(exc.detail, dict | list):
        body = error_body(_drf_code(exc), "The request is invalid.", fields=exc.detail)
    else:
        body = error_body(_drf_code(exc), str(exc.detail))
    return Response(body, status=exc.status_code, headers=headers)


class SafeJSONParser(JSONParser):
    """DRF's JSONParser, answering 400 ``invalid`` (not a 500) for JSON nested deeper than Python's
    recursion limit. The size limit needs nothing here: DRF reads JSON bodies through
    ``request.body``, which enforces DATA_UPLOAD_MAX_MEMORY_SIZE (413 ``too_large``, tested)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise exceptions.ParseError("JSON parse error - nested too deeply.") from exc


class JSONFirstContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, answered at once for what agents send (no Accept, ``*/*`` or
    ``application/json``, no ``?format=``) when the view's first renderer is JSON: the renderer and media
    type DRF's own search would pick, without parsing and ranking the header for every request. Anything
    else (a browser's Accept, ``?format=api``) goes through DRF's negotiation unchanged."""

    FAST_ACCEPT = frozenset({"", "*/*", "application/json"})

    def select_renderer(self, request: Any, renderers: Any, format_suffix: str | None = None) -> Any:
        if (
            not format_suffix
            and renderers
            and renderers[0].media_type == "application/json"
            and request.META.get("HTTP_ACCEPT", "").strip() in self.FAST_ACCEPT
            and f"{self.settings.URL_FORMAT_OVERRIDE}=" not in request.META.get("QUERY_STRING", "")
        ):
            return renderers[0], renderers[0].media_type
        return super().select_renderer(request, renderers, format_suffix)


class CreatedCursorPagination(CursorPagination):
    """Newest first, stable under inserts: the cursor encodes a position, not an offset.

    A page is bounded twice (issue 28: an answer costs its process memory and time whoever asks): at most
    ``max_page_size`` rows, and, for lists of heavy rows (``within_bytes``), about API_PAGE_MAX_BYTES of
    rendered JSON. 100 rows: 500 whole todos were a 128 MB answer."""

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 100

    def within_bytes(self, render: Callable[[Any], Any], budget: int | None = None) -> list[Any]:
        """The page (after paginate_queryset) rendered row by row by ``render``, stopped before the row that
        would take it past ``budget`` bytes of JSON (API_PAGE_MAX_BYTES; always at least one row). A page cut
        short links on from its last row, as if its size had been the rows it kept, so a client that follows
        ``next`` (or ``previous``) sees every row once. The rows nearest the cursor are kept: the first ones of
        a forward page, the last ones of a backward one."""
        budget = settings.API_PAGE_MAX_BYTES if budget is None else budget
        page = list(self.page or [])
        backward = self.cursor is not None and self.cursor.reverse
        rows = list(reversed(page)) if backward else page
        rendered: list[Any] = []
        size = 0
        for row in rows:
            data = render(row)
            size += len(json.dumps(data, cls=encoders.JSONEncoder))
            if rendered and size > budget:
                break
            rendered.append(data)
        kept = len(rendered)
        if kept < len(rows):
            # The first row left out is "the row after the page": its position is where the cursor goes on.
            beyond = self._get_position_from_instance(rows[kept], self.ordering)
            self.page_size = kept
            if backward:
                self.page = page[-kept:]
                self.has_previous, self.previous_position = True, beyond
            else:
                self.page = page[:kept]
                self.has_next, self.next_position = True, beyond
        return list(reversed(rendered)) if backward else rendered

    def decode_cursor(self, request: Any) -> Any:
        """DRF's cursor, whose position (a time: every ordering here starts with one) must parse as a
        time: DRF filters on it as given, and Django refuses anything else in the query (a 500)."""
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None and not _is_time(str(cursor.position)):
            raise exceptions.NotFound(self.invalid_cursor_message)
        return cursor


def _is_time(text: str) -> bool:
    try:
        return parse_datetime(text) is not None
    except ValueError:  # the shape of a time, but not one (month 13)
        return False


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Outside DRF views too (ingest, admin, health), a lost database (or a timeout, or contention:
    switchboard/dberrors.py) answers 503 JSON, never a 500 page with a trace; the next request
    reconnects (CONN_HEALTH_CHECKS). MiddlewareMixin makes it async-capable, so under ASGI an async
    view behind it holds no thread."""

    def process_exception(self, request: Any, exception: Exception) -> JsonResponse | None:
        if isinstance(exception, DatabaseError) and (answer := dberrors.error_answer(exception)):
            code, detail = answer
            return JsonResponse(error_body(code, detail), status=STATUS_BY_CODE[code], headers={"Retry-After": "1"})
        if request.path.startswith("/api/"):
            if isinstance(exception, DatabaseError) and dberrors.refused_value(exception):
                return JsonResponse(error_body("invalid", REFUSED_VALUE), status=400)
            # An API client never gets Django's HTML error page (DEBUG on or off); the trace goes to
            # the log, with the request id the client sees.
            logger.exception("unhandled error on %s %s", request.method, redact_tokens(request.path))
            return JsonResponse(error_body("internal", "An unexpected error occurred."), status=500)
        return None


@csrf_exempt  # read-only; a POST gets the JSON 405 rather than the CSRF page
def api_root(request: HttpRequest) -> JsonResponse:
    """/api/v1/: where things are (the banner of `make run` links here). No authentication: it names
    only public paths."""
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse(error_body("method_not_allowed", f'Method "{request.method}" not allowed.'), status=405)
        response["Allow"] = "GET, HEAD"
        return response
    return JsonResponse(
        {
            "todos": request.build_absolute_uri(reverse("todo-list")),
            "queues": request.build_absolute_uri(reverse("queue-list")),
            "events": request.build_absolute_uri(reverse("events:list")),
            "schema": request.build_absolute_uri(reverse("schema")),
            "docs": request.build_absolute_uri(reverse("api-docs")),
        }
    )


@csrf_exempt  # it only ever answers 404; a session's POST must get that JSON, not the CSRF page
def api_not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Every unmatched path under /api/ answers JSON 404. Mounted last under api/, it also keeps
    APPEND_SLASH from redirecting (or, for a POST, failing with a 500): a path that exists with a
    trailing slash is named in the answer instead."""
    extra: dict[str, Any] = {}
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not api_not_found:
            extra["path"] = request.path + "/"
    detail = f"No API path {request.path}." + (f" Did you mean {extra['path']}?" if extra else "")
    return JsonResponse(error_body("not_found", detail, **extra), status=404)
