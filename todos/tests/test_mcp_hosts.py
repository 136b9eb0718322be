"""Which Host and Origin /mcp answers, read as Django reads them (todos/mcp/server.py): the unit cases that
the live tests in test_mcp_tools.py cannot set, such as the trusted origins and a proxy's forwarded host."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from django.core.handlers.asgi import ASGIRequest
from django.test import override_settings

from todos.mcp.server import RESOURCE_METADATA_PATH, _origin_allowed, resource_metadata


def _request(host: str, origin: str | None = None, **headers: str) -> ASGIRequest:
    raw = [(b"host", host.encode())]
    if origin is not None:
        raw.append((b"origin", origin.encode()))
    raw += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "query_string": b"", "headers": raw}
    return ASGIRequest(scope, io.BytesIO())


@override_settings(
    ALLOWED_HOSTS=["mcp.example.com"], CSRF_TRUSTED_ORIGINS=["https://app.example.org", "https://*.tools.example.net"]
)
@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://mcp.example.com", True),  # the server itself
        ("https://app.example.org", True),  # trusted exactly
        ("https://inspector.tools.example.net", True),  # a trusted wildcard
        ("http://inspector.tools.example.net", False),  # the wildcard's scheme only
        ("https://app.example.org.evil.example.com", False),
        ("https://evil.example.com", False),
        ("null", False),
    ],
)
def test_an_origin_is_the_server_or_a_trusted_origin(origin, allowed):
    request = _request("mcp.example.com", origin)
    assert _origin_allowed(request, f"http://{request.get_host()}") is allowed


def _metadata(host: str, **headers: str) -> tuple[int, dict[str, object]]:
    """GET the protected-resource document from the ASGI app itself."""
    raw = [(b"host", host.encode())] + [(n.replace("_", "-").encode(), v.encode()) for n, v in headers.items()]
    scope = {
        "type": "http",
        "method": "GET",
        "path": RESOURCE_METADATA_PATH + "/mcp",
        "query_string": b"",
        "headers": raw,
    }
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(resource_metadata(scope, receive, send))
    return int(sent[0]["status"]), json.loads(sent[1]["body"])  # type: ignore[arg-type]


@override_settings(ALLOWED_HOSTS=["mcp.example.com"], USE_X_FORWARDED_HOST=True)
def test_behind_a_proxy_the_forwarded_host_is_the_one_checked_and_named():
    status, body = _metadata("10.0.0.7:8000", X_Forwarded_Host="mcp.example.com", X_Forwarded_Proto="https")
    assert status == 200 and body["resource"] == "http://mcp.example.com/mcp"
    status, body = _metadata("mcp.example.com", X_Forwarded_Host="evil.example.com")
    assert status == 400 and "evil" not in json.dumps(body)


@override_settings(ALLOWED_HOSTS=["mcp.example.com"], SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"))
def test_the_scheme_follows_the_proxys_header_as_django_trusts_it():
    assert _metadata("mcp.example.com", X_Forwarded_Proto="https")[1]["resource"] == "https://mcp.example.com/mcp"
    assert _metadata("mcp.example.com")[1]["resource"] == "http://mcp.example.com/mcp"
