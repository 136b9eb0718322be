"""What every API view shares: Bearer-token authentication, the caller's identity, the one error
shape, and cursor pagination. Apps' api/ packages build on these; none re-implements them."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.models.signals import post_delete, post_save
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from todos.errors import QueueError
from todos.models import Agent, hash_token

logger = logging.getLogger(__name__)

# code -> HTTP status. QueueError subclasses (and ingest's errors) carry a code; this is the one place
# that turns a code into a status.
STATUS_BY_CODE = {
    "invalid": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "too_large": 413,
    "unavailable": 503,
}


class AgentPrincipal:
    """request.user for a request authenticated by an agent's token (request.auth is the Agent)."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.username = agent.name
        self.pk = None

    def __str__(self) -> str:
        return f"agent:{self.agent.name}"


# token hash -> (monotonic expiry, Agent), when API_TOKEN_CACHE_SECONDS > 0. The token lookup is a
# database round trip and about a third of an API request's CPU; cached, a revoked or deactivated
# agent keeps working in other processes for up to that many seconds (this process forgets it at
# once, on save). Only known tokens are cached, so unknown ones cannot fill it.
_token_cache: dict[str, tuple[float, Agent]] = {}
_TOKEN_CACHE_MAX = 10_000


def _active_agent(token_hash: str) -> Agent | None:
    ttl = settings.API_TOKEN_CACHE_SECONDS
    if ttl > 0:
        hit = _token_cache.get(token_hash)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
    agent = Agent.objects.filter(token_hash=token_hash, is_active=True).first()
    if ttl > 0 and agent is not None:
        if len(_token_cache) >= _TOKEN_CACHE_MAX:
            _token_cache.clear()
        _token_cache[token_hash] = (time.monotonic() + ttl, agent)
    return agent


def _forget_agent(sender: Any, instance: Agent, **kwargs: Any) -> None:
    _token_cache.pop(instance.token_hash, None)


post_save.connect(_forget_agent, sender=Agent, dispatch_uid="switchboard.api.forget_agent")
post_delete.connect(_forget_agent, sender=Agent, dispatch_uid="switchboard.api.forget_agent.delete")


class BearerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <token>``; the token is looked up by its SHA-256 hash."""

    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[AgentPrincipal, Agent] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Invalid token.") from exc
        # The lookup is by hash, an indexed equality on a digest: its timing reveals nothing about
        # stored tokens, and the plaintext is never stored or logged.
        agent = _active_agent(hash_token(token))
        if agent is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return AgentPrincipal(agent), agent

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="switchboard"'


def caller_agent(request: Request) -> Agent:
    """The Agent a request acts as. Staff users on a session act as an unsaved agent named after them
    with every queue in scope (SPEC: staff reach the same API with their session)."""
    if isinstance(request.auth, Agent):
        return request.auth
    user = request.user
    if user is not None and user.is_authenticated and user.is_staff:
        return Agent(
            name=f"staff:{user.get_username()}",
            claim_scopes=["*"],
            create_scopes=["*"],
            can_retry_dead_letters=True,
            can_manage_queues=True,
        )
    raise exceptions.NotAuthenticated()


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
    if isinstance(exc, QueueError):
        return Response(error_body(exc.code, exc.detail, **exc.extra), status=STATUS_BY_CODE[exc.code])
    if isinstance(exc, OperationalError | InterfaceError):
        logger.warning("database unavailable: %s", exc.__class__.__name__)
        return Response(
            error_body("unavailable", "The database is unavailable; retry shortly."),
            status=503,
            headers={"Retry-After": "1"},
        )
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

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise exceptions.ParseError("JSON parse error - nested too deeply.") from exc


class CreatedCursorPagination(CursorPagination):
    """Newest first, stable under inserts: the cursor encodes a position, not an offset."""

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class DatabaseUnavailableMiddleware:
    """Outside DRF views too (ingest, admin, health), a lost database answers 503 JSON, never a 500
    page with a trace; the next request reconnects (CONN_HEALTH_CHECKS)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)

    def process_exception(self, request: Any, exception: Exception) -> JsonResponse | None:
        if isinstance(exception, OperationalError | InterfaceError) or (
            isinstance(exception, DatabaseError) and "connection" in str(exception).lower()
        ):
            logger.warning("database unavailable: %s", exception.__class__.__name__)
            return JsonResponse(
                error_body("unavailable", "The database is unavailable; retry shortly."),
                status=503,
                headers={"Retry-After": "1"},
            )
        return None
