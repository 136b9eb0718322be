"""One middleware for what every request shares: its request id, its log line and its metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

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
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
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

    def _observe(self, request: HttpRequest, status: int, elapsed: float) -> None:
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else UNMATCHED_ROUTE
        method = request.method if request.method in metrics.HTTP_METHODS else "OTHER"
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
            agent=_agent_name(request),
        )


def _agent_name(request: Any) -> str | None:
    # DRF copies the authenticated agent onto the Django request (request.auth). A session user is
    # not looked up here: that would cost a query for a log field.
    auth = getattr(request, "auth", None)
    return getattr(auth, "name", None) if auth is not None else None
