"""One middleware for what every request shares: its request id, its log line and its metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware  # type: ignore[import-untyped]

from switchboard import metrics
from switchboard.logs import accept_request_id, log_event, request_id_var

logger = logging.getLogger("switchboard.request")

# Probes and scrapes arrive every few seconds from every load balancer and Prometheus server; their
# lines would drown the rest. They are logged at DEBUG (and still measured).
QUIET_ROUTES = frozenset({"healthz", "readyz", "metrics"})
UNMATCHED_ROUTE = "<unmatched>"


class RequestObservabilityMiddleware:
    """Request id (from a valid X-Request-ID or generated; echoed back; on every log record), one
    structured log line per request, and latency by route pattern.

    Placed first in MIDDLEWARE so that it measures and logs everything after it, redirects included.
    Sync and async: under ASGI a sync-only middleware would run the whole chain, async views
    included, in a thread, and a waiting long-poll would hold it.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self._acall(request)
        request_id = accept_request_id(request.headers.get("X-Request-ID"))
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500
        try:
            response = self.get_response(request)
            status = response.status_code
            response["X-Request-ID"] = request_id
            return response
        finally:
            elapsed = time.perf_counter() - started
            self._observe(request, status, elapsed)
            request_id_var.reset(token)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        request_id = accept_request_id(request.headers.get("X-Request-ID"))
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500
        try:
            response: HttpResponse = await self.get_response(request)
            status = response.status_code
            response["X-Request-ID"] = request_id
            return response
        finally:
            self._observe(request, status, time.perf_counter() - started)
            request_id_var.reset(token)

    def _observe(self, request: HttpRequest, status: int, elapsed: float) -> None:
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else UNMATCHED_ROUTE
        record_request(request.method or "", route, status, elapsed, _agent_name(request))


def record_request(method: str, route: str, status: int, elapsed: float, agent: str | None) -> None:
    """The request's log line and metrics: Django's requests (above), the ASGI apps mounted beside Django
    and the bodies refused before either (switchboard/mounted.py, switchboard/body_limit.py)."""
    method = method if method in metrics.HTTP_METHODS else "OTHER"
    metrics.HTTP_REQUESTS.labels(method=method, route=route, status=str(status)).inc()
    metrics.HTTP_LATENCY.labels(method=method, route=route).observe(elapsed)
    log_event(
        logger,
        logging.DEBUG if route in QUIET_ROUTES else logging.INFO,
        "request",
        method=method,
        route=route,
        status=status,
        duration_ms=round(elapsed * 1000, 1),
        agent=agent,
    )


def _agent_name(request: Any) -> str | None:
    # DRF copies the authenticated agent onto the Django request (request.auth). A session user is
    # not looked up here: that would cost a query for a log field.
    auth = getattr(request, "auth", None)
    return getattr(auth, "name", None) if auth is not None else None


class StaticFilesMiddleware(WhiteNoiseMiddleware):  # type: ignore[misc]
    """WhiteNoise (the admin's static files, served by the web process itself), sync and async:
    WhiteNoise's own middleware is sync-only, which under ASGI would put every request in a thread."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any], **kwargs: Any) -> None:
        super().__init__(get_response, **kwargs)
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            served: HttpResponse = await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
            return served
        response: Awaitable[HttpResponse] = self.get_response(request)
        return await response


class _OnTheLoop:
    """For a Django middleware (MiddlewareMixin) whose hooks only look at the request and the answer (no
    database, no file, no lock): under the async chain Django runs its process_request and
    process_response each through sync_to_async, a hop into asgiref's one thread and back; these run
    them on the loop, where they cost microseconds. The sync chain is Django's own."""

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)  # type: ignore[attr-defined]
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response  # type: ignore[no-any-return]


class SecurityOnTheLoopMiddleware(_OnTheLoop, SecurityMiddleware):
    """Django's SecurityMiddleware (HTTPS redirect, HSTS, nosniff, referrer and COOP headers), with no
    thread hop under the async chain."""


class CommonOnTheLoopMiddleware(_OnTheLoop, CommonMiddleware):
    """Django's CommonMiddleware (disallowed user agents, APPEND_SLASH, PREPEND_WWW), with no thread hop
    under the async chain: its one lookup is URL resolving, in memory."""


class XFrameOptionsOnTheLoopMiddleware(_OnTheLoop, XFrameOptionsMiddleware):
    """Django's XFrameOptionsMiddleware (X-Frame-Options: DENY), with no thread hop under the async chain."""
