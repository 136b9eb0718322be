"""/mcp behind the guards Django's middleware gives every other path (issue 28, L5): it runs beside Django
(switchboard/asgi.py), so the HTTPS rule, HSTS, the request id and the request's log line are
switchboard/mounted.py's; the Origin check is todos/mcp/server.py's. On the Procfile's server."""

from __future__ import annotations

import io
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import requests
from django.core.handlers.asgi import ASGIRequest
from django.test import override_settings

from todos.mcp.server import _origin_allowed
from todos.models import Agent
from todos.tests.gunicorn_live import Server

ACCEPT = "application/json, text/event-stream"
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def _request(host: str, origin: str) -> ASGIRequest:
    headers = [(b"host", host.encode()), (b"origin", origin.encode())]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "query_string": b"", "headers": headers}
    return ASGIRequest(scope, io.BytesIO())


@override_settings(ALLOWED_HOSTS=["localhost"], CSRF_TRUSTED_ORIGINS=["http://localhost:6274"])
@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost:8000", True),  # the server itself
        ("http://localhost:3000", False),  # another local server: same host name, another origin
        ("https://localhost:8000", False),  # the other scheme
        ("http://localhost", False),  # the other port
        ("http://LOCALHOST:8000", True),  # a host name's case is no difference
        ("http://localhost:6274", True),  # the MCP Inspector, trusted by name
    ],
)
def test_an_origin_is_its_scheme_host_and_port_not_a_host_name_alone(origin: str, allowed: bool) -> None:
    request = _request("localhost:8000", origin)
    assert _origin_allowed(request, f"http://{request.get_host()}") is allowed


@pytest.fixture(scope="module")
def https_server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Production's HTTPS settings behind a TLS-terminating proxy (X-Forwarded-Proto), logging requests."""
    env = {"SECURE_SSL_REDIRECT": "true", "TRUST_X_FORWARDED_PROTO": "true", "LOG_LEVEL": "INFO"}
    live = Server(1, tmp_path_factory.mktemp("mcp-transport"), env)
    yield live
    live.stop()


def _post_mcp(server: Server, token: str, **extra: str) -> Any:
    headers = {"Accept": ACCEPT, "Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-11-25"}
    headers |= {name.replace("_", "-"): value for name, value in extra.items()}
    return requests.post(server.base + "/mcp", json=LIST_TOOLS, headers=headers, timeout=30)


def _log_since(server: Server, offset: int, *, holding: Iterable[str] = (), timeout: float = 10.0) -> str:
    """The server's log after ``offset``, once it holds every string of ``holding``: a request's line is
    written after its answer is sent, so a client can read the log before its last request's line is in."""
    deadline = time.monotonic() + timeout
    while True:
        server.log.seek(offset)
        log = server.log.read().decode(errors="replace")
        if all(text in log for text in holding) or time.monotonic() > deadline:
            return log
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_plain_http_to_mcp_is_refused_when_https_is_required(https_server: Server, agent: Agent) -> None:
    refused = _post_mcp(https_server, agent.token)  # type: ignore[attr-defined]
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "forbidden"
    assert "https://127.0.0.1:" in refused.json()["error"]["detail"]
    # The metadata document is mounted beside it: the same rule.
    document = requests.get(https_server.base + "/.well-known/oauth-protected-resource/mcp", timeout=30)
    assert document.status_code == 403
    # Through the proxy, which says the client spoke HTTPS, it is served, with Django's HSTS.
    served = _post_mcp(https_server, agent.token, X_Forwarded_Proto="https")  # type: ignore[attr-defined]
    assert served.status_code == 200, served.text
    assert served.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert served.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_each_mcp_request_has_a_request_id_and_one_log_line_without_its_token(
    https_server: Server, agent: Agent
) -> None:
    offset = https_server.log.seek(0, 2)
    token: str = agent.token  # type: ignore[attr-defined]
    served = _post_mcp(https_server, token, X_Forwarded_Proto="https", X_Request_ID="mcp-call-7")
    assert served.status_code == 200 and served.headers["X-Request-ID"] == "mcp-call-7"
    anonymous = requests.post(
        https_server.base + "/mcp",
        json=LIST_TOOLS,
        headers={"Accept": ACCEPT, "X-Forwarded-Proto": "https"},
        timeout=30,
    )
    assert anonymous.status_code == 401 and len(anonymous.headers["X-Request-ID"]) == 32  # one was made
    anonymous_id = anonymous.headers["X-Request-ID"]
    log = _log_since(https_server, offset, holding=("[mcp-call-7] request ", f"[{anonymous_id}] request "))
    [line] = [line for line in log.splitlines() if "[mcp-call-7]" in line and " request " in line]
    assert "method=POST route=mcp status=200" in line and "duration_ms=" in line and f"agent={agent.name}" in line
    assert any(f"[{anonymous_id}]" in line and "status=401 " in line for line in log.splitlines()), log
    assert token not in log and "tools/list" not in log
