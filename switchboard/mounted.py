"""What Django's middleware gives every Django request, for the ASGI apps mounted beside Django
(settings.ASGI_MOUNTS: /mcp and its metadata document), which no Django middleware sees (issue 28):

- SecurityMiddleware's HTTPS rule: with SECURE_SSL_REDIRECT, a plain-HTTP request (read as Django reads
  it, SECURE_PROXY_SSL_HEADER included) is refused, not redirected: an MCP client that followed a
  redirect would send its bearer token again, and what it sent in clear is already gone. HSTS and
  nosniff on every answer, as Django adds them.
- RequestObservabilityMiddleware's request id (X-Request-ID, kept if valid, echoed), log line and
  metrics, by the mount's prefix as its route. Never the token, the body nor the path's text.
"""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest

from switchboard.api import error_body
from switchboard.logs import accept_request_id, request_id_var
from switchboard.middleware import record_request

Scope = dict[str, Any]
Message = dict[str, Any]

# A mounted app that authenticates its caller names it here (a str), for the request's log line.
CALLER_SCOPE_KEY = "switchboard.caller"


def _security_headers(secure: bool) -> list[tuple[bytes, bytes]]:
    """The headers Django's SecurityMiddleware adds to an answer (its HSTS only over HTTPS)."""
    headers = []
    if secure and settings.SECURE_HSTS_SECONDS:
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            hsts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            hsts += "; preload"
        headers.append((b"strict-transport-security", hsts.encode()))
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    return headers


def _must_be_https(request: ASGIRequest) -> bool:
    if not settings.SECURE_SSL_REDIRECT or request.is_secure():
        return False
    path = request.path.lstrip("/")
    return not any(re.search(pattern, path) for pattern in settings.SECURE_REDIRECT_EXEMPT)


def _https_refusal(request: ASGIRequest) -> tuple[int, bytes]:
    try:  # named only for a host this server answers to: a forged Host is never echoed
        where = f" https://{request.get_host()}{request.path}"
    except DisallowedHost:
        where = " HTTPS"
    detail = f"This endpoint is served over HTTPS only: use{where}."
    return 403, json.dumps(error_body("forbidden", detail)).encode()


async def serve(app: Any, route: str, scope: Scope, receive: Any, send: Any) -> None:
    """Serve a request to the app mounted at ``route`` behind the rules above."""
    started = time.perf_counter()
    request = ASGIRequest(scope, io.BytesIO())
    request_id = accept_request_id(request.headers.get("X-Request-ID"))
    id_token = request_id_var.set(request_id)
    added = [(b"x-request-id", request_id.encode()), *_security_headers(request.is_secure())]
    status = 500

    async def observed_send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            present = {name.lower() for name, _ in message.get("headers", [])}
            extra = [(name, value) for name, value in added if name not in present]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    try:
        if _must_be_https(request):
            refusal_status, body = _https_refusal(request)
            await observed_send(
                {
                    "type": "http.response.start",
                    "status": refusal_status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await observed_send({"type": "http.response.body", "body": body})
        else:
            await app(scope, receive, observed_send)
    finally:
        caller = scope.get(CALLER_SCOPE_KEY)
        record_request(request.method or "", route, status, time.perf_counter() - started, caller)
        request_id_var.reset(id_token)
