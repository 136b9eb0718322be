"""Request bodies bounded before anything reads them (issue 28): the outermost ASGI layer, around Django and
every mounted app (/mcp, /.well-known/...).

Django's ASGI handler spools the whole body to a temporary file before any routing, host or size check,
and DATA_UPLOAD_MAX_MEMORY_SIZE is checked later, against a declared Content-Length only; uvicorn sets no
limit of its own. So one anonymous request with ``Content-Length: 5000000000``, or a chunked body that
never ends, filled the disk and the worker's memory. Here a declared length above the route's limit is
answered 413 before a byte of the body is read, and a streamed body is counted as it arrives: the first
message past the limit is answered 413, the app is told the client went away, and the connection is
closed (nothing more is read).

The route's limit: a webhook's (INGEST_MAX_BODY_BYTES) under /ingest/, DATA_UPLOAD_MAX_MEMORY_SIZE on
every other path. The admin's forms are urlencoded (no file uploads), which Django bounds by the same
setting, so they need no allowance.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import get_script_prefix

from switchboard import metrics
from switchboard.api import error_body
from switchboard.middleware import UNMATCHED_ROUTE, record_request

Scope = dict[str, Any]
Message = dict[str, Any]

# The webhook receiver's mount (switchboard/urls.py): its bodies have their own bound.
INGEST_PREFIX = "/ingest"


def _is_ingest(scope: Scope) -> bool:
    path: str = scope.get("path", "").removeprefix(get_script_prefix(scope).rstrip("/"))
    return path == INGEST_PREFIX or path.startswith(INGEST_PREFIX + "/")


def route_limit(scope: Scope) -> int:
    """The most body bytes a request to this path may send."""
    return int(settings.INGEST_MAX_BODY_BYTES if _is_ingest(scope) else settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def declared_length(scope: Scope) -> int | None:
    """The Content-Length header as a number, or None (absent: a chunked body, or none). The ASGI server
    has already refused a malformed or repeated one."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Any, limit: int) -> None:
    body = json.dumps(error_body("too_large", f"The request body is over {limit} bytes.", limit=limit)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is never read: the connection cannot carry another request.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _log_refusal(scope: Scope, started: float) -> None:
    # Refused before routing: no route to name. Never the path (an attacker's text) nor the body.
    record_request(scope.get("method", ""), UNMATCHED_ROUTE, 413, time.perf_counter() - started, None)
    if _is_ingest(scope):  # counted as the receiver counts its own 413s; the slug is not trusted yet
        metrics.record_ingest_delivery("unknown", "rejected_too_large")


async def bounded(app: Any, scope: Scope, receive: Any, send: Any) -> None:
    """Run ``app`` with the request's body bounded by its route's limit."""
    started = time.perf_counter()
    limit = route_limit(scope)
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        await _refuse(send, limit)
        _log_refusal(scope, started)
        return
    received = 0
    refused = False
    answering = False  # the app has started its own answer

    async def counted_receive() -> Message:
        nonlocal received, refused
        if refused:
            return {"type": "http.disconnect"}
        message: Message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                refused = True
                if not answering:
                    await _refuse(send, limit)
                    _log_refusal(scope, started)
                # To the app, the client went away: Django's read_body and the MCP SDK stop reading.
                return {"type": "http.disconnect"}
        return message

    async def guarded_send(message: Message) -> None:
        nonlocal answering
        if refused:
            return  # the 413 has been sent; whatever the app says now goes nowhere
        if message["type"] == "http.response.start":
            answering = True
        await send(message)

    await app(scope, counted_receive, guarded_send)
