"""Hostile bodies against the Procfile's server (gunicorn + uvicorn workers), issue 28: a declared length
past the route's limit is refused before a byte is read, a chunked body is cut at the limit, deep JSON is
a 400, on every path (the API, /mcp, a webhook's), while /healthz answers and no worker is restarted.

Raw sockets, not an HTTP library: the attacks are requests no well-behaved client sends."""

from __future__ import annotations

import hashlib
import hmac
import json
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.models import Source
from todos.models import Agent
from todos.tests.gunicorn_live import Server, worker_pids

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMIT = 1024 * 1024  # the defaults: MAX_REQUEST_BYTES and INGEST_MAX_BODY_BYTES
CLAIM = "/api/v1/todos/claim/"
# How far past the limit the client may have got before the server's refusal reached it: what the two
# kernels buffer on a loopback connection whose reader stopped (measured: under 1 MB).
KERNEL_SLACK = 4 * 1024 * 1024
# A refusal must come this fast; the unguarded server spooled to disk, then answered, or never did.
PROMPT = 5.0
HMAC_SECRET = "deep-json-secret"


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # One worker, so that a restart shows; a watchdog window short enough to fire within a test.
    live = Server(1, tmp_path_factory.mktemp("bodies"), {"WATCHDOG_SECONDS": "3"})
    yield live
    live.stop()


@pytest.fixture
def worker(server: Server) -> Iterator[int]:
    """The server's one worker, which must still be serving, unrestarted, when the test is over."""
    [pid] = worker_pids(server.proc.pid)
    logged_before = server.log.seek(0, 2)
    yield pid
    assert worker_pids(server.proc.pid) == {pid}, server.output()
    server.log.seek(logged_before)
    log = server.log.read().decode(errors="replace")
    assert "request path stuck" not in log and "Exception in ASGI application" not in log, log[-4000:]


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=PROMPT)
    # A small send buffer keeps what the client can push past the refusal to what the server buffers.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    return sock


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response read from ``sock``: status, headers (lower-cased names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-answer"
        body += chunk
    return int(status_line.split()[1]), headers, body


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection after its answer (a reset counts)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _send_chunked(sock: socket.socket, total: int, chunk_size: int = 16 * 1024) -> int:
    """Send up to ``total`` bytes of chunked body, stopping when the server answers or hangs up; the
    bytes of body sent."""
    chunk = b"[" * chunk_size
    frame = f"{chunk_size:x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            if select.select([sock], [], [], 0)[0]:  # the server has answered
                break
            sock.sendall(frame)
            sent += chunk_size
        else:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def _token_agent() -> Agent:
    agent = Agent(name="attacker", claim_scopes=["sandbox"], create_scopes=["sandbox"])
    agent.token = agent.set_new_token()  # type: ignore[attr-defined]
    agent.save()
    return agent


def _get(server: Server, path: str) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(server.base + path, timeout=PROMPT) as response:  # noqa: S310 (local)
        return response.status, time.monotonic() - started


PATHS = [CLAIM, "/mcp", "/ingest/anything/", "/healthz", "/.well-known/oauth-protected-resource/mcp", "/admin/"]


@pytest.mark.parametrize("path", PATHS)
def test_a_declared_5_gb_body_is_refused_with_413_before_any_of_it_is_sent(
    server: Server, worker: int, path: str
) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(_head("POST", path, {"Content-Type": "application/json", "Content-Length": "5000000000"}))
        status, headers, body = _response(sock)
        assert time.monotonic() - started < PROMPT
        assert status == 413 and headers["content-type"] == "application/json"
        assert json.loads(body) == {
            "error": {"code": "too_large", "detail": f"The request body is over {LIMIT} bytes.", "limit": LIMIT}
        }
        assert headers["connection"] == "close" and _closed(sock)
    if path.startswith("/ingest/"):  # counted as the receiver counts its own refusals
        with urllib.request.urlopen(server.base + "/metrics", timeout=PROMPT) as response:  # noqa: S310 (local)
            scraped = response.read().decode()
        counted = [
            float(line.rsplit(" ", 1)[1])
            for line in scraped.splitlines()
            if line.startswith("switchboard_ingest_deliveries_total{")
            and 'outcome="rejected_too_large"' in line
            and 'source="unknown"' in line
        ]
        assert counted and counted[0] >= 1, scraped[-2000:]


@pytest.mark.parametrize("path", [CLAIM, "/ingest/anything/", "/healthz", "/mcp"])
def test_a_chunked_body_is_cut_at_the_limit_with_413_and_the_connection_closed(
    server: Server, worker: int, path: str
) -> None:
    # No token: the long-poll router once read all of it into memory before authenticating, and
    # Django spooled all of it to disk before routing at all. /mcp is refused the same way with a
    # token (the SDK's own limit would answer after the guard's anyway).
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    if path == "/mcp":
        headers |= {"Authorization": f"Bearer {_token_agent().token}", "Accept": "application/json"}  # type: ignore[attr-defined]
    attempted = 64 * 1024 * 1024
    healthz: list[float] = []

    def probe_healthz() -> None:
        for _ in range(5):
            status, took = _get(server, "/healthz")
            assert status == 200
            healthz.append(took)

    with _connect(server) as sock:
        sock.sendall(_head("POST", path, headers))
        prober = threading.Thread(target=probe_healthz)
        prober.start()
        sent = _send_chunked(sock, attempted)
        status, answer_headers, body = _response(sock)
        prober.join()
        assert status == 413 and json.loads(body)["error"]["code"] == "too_large"
        assert sent < LIMIT + KERNEL_SLACK, sent  # the rest was never read: the sender was stopped
        assert answer_headers["connection"] == "close" and _closed(sock)
    assert len(healthz) == 5 and max(healthz) < 2.0, healthz


def _deep(depth: int = 100_000) -> bytes:
    return b"[" * depth


def _post(server: Server, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    with _connect(server) as sock:
        all_headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}
        sock.sendall(_head("POST", path, all_headers) + body)
        status, answer_headers, answer = _response(sock)
    return status, answer_headers, json.loads(answer)


def test_a_hundred_thousand_brackets_to_the_claim_route_are_a_400_not_a_500(server: Server, worker: int) -> None:
    token = _token_agent().token  # type: ignore[attr-defined]
    status, _, body = _post(server, CLAIM, _deep(), {"Authorization": f"Bearer {token}"})
    assert status == 400 and body["error"]["code"] == "invalid", body
    # Anonymous, it is refused as any anonymous claim is: before its body matters.
    status, _, body = _post(server, CLAIM, _deep(), {})
    assert status == 401 and body["error"]["code"] == "unauthorized", body
    # Deep inside a long-poll's body too: the router reads it, and falls back to the sync path.
    deep_wait = b'{"wait_seconds": 1, "queues": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, _, body = _post(server, CLAIM, deep_wait, {"Authorization": f"Bearer {token}"})
    assert status == 400 and body["error"]["code"] == "invalid", body


def test_a_hundred_thousand_brackets_to_mcp_are_a_400(server: Server, worker: int) -> None:
    token = _token_agent().token  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    status, _, body = _post(server, "/mcp", _deep(), headers)
    assert status == 400 and body["error"]["code"] == -32700, body  # JSON-RPC's parse error


def test_a_hundred_thousand_brackets_to_a_webhook_are_a_400(server: Server, worker: int) -> None:
    Source.objects.create(slug="deep", provider="hmac", secret=HMAC_SECRET)
    body = b'{"a": ' + _deep() + b"}"
    signature = "sha256=" + hmac.new(HMAC_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-Signature-256": signature, "X-Delivery-Id": "d-1", "X-Event-Type": "deep"}
    status, _, answer = _post(server, "/ingest/deep/", body, headers)
    assert status == 400 and answer["error"]["code"] == "invalid", answer


def test_a_body_within_the_limit_still_reaches_its_view(server: Server, worker: int, tmp_path: Path) -> None:
    # The guard counts; it does not get in the way: a chunked claim just under the limit is served.
    token = _token_agent().token  # type: ignore[attr-defined]
    body = json.dumps({"queues": ["sandbox"], "limit": 1, "lease_seconds": 30}).encode()
    body += b" " * (LIMIT - len(body))
    with _connect(server) as sock:
        head = _head(
            "POST",
            CLAIM,
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        )
        sock.sendall(head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        status, _, answer = _response(sock)
    assert status == 200 and json.loads(answer) == {"todos": []}
