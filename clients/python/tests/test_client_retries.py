"""When the client resends: a 503 (the server's transaction rolled back) is retried for every verb but a
create without an idempotency key; a connection that never opened is always retried. The server here
is a real HTTP server on a socket that answers 503 a set number of times, then a real todo's JSON."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from switchboard_client import Client, ServerUnreachable, Throttled, Unavailable

TODO = {
    "id": "td_1",
    "queue": "q",
    "source": "",
    "kind": "",
    "title": "",
    "payload": {},
    "event": None,
    "idempotency_key": "k",
    "assignee": None,
    "state": "pending",
    "dead_letter": False,
    "owner": None,
    "lease_id": None,
    "lease_expires_at": None,
    "attempt": 0,
    "max_attempts": 5,
    "next_retry_at": None,
    "run_at": "2026-01-01T00:00:00Z",
    "priority": 0,
    "result": None,
    "errors": [],
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
    "claimed_at": None,
    "completed_at": None,
}


class Flaky(http.server.BaseHTTPRequestHandler):
    failures = 0
    throttled = False
    requests: list[str] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        Flaky.requests.append(f"{self.command} {self.path}")
        if Flaky.failures > 0:
            Flaky.failures -= 1
            status, body = 503, {"error": {"code": "unavailable", "detail": "The database is unavailable."}}
            if Flaky.throttled:
                status, body = 429, {"error": {"code": "throttled", "detail": "Over.", "limit": "AGENT_MAX_WAITS"}}
        else:
            status, body = (201, {**TODO, "created": True}) if self.command == "POST" else (200, TODO)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    Flaky.requests, Flaky.failures, Flaky.throttled = [], 0, False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_503_is_retried_with_backoff_until_the_answer(flaky):
    Flaky.failures = 2
    with Client(flaky, "t", backoff=0.001) as client:
        assert client.get("td_1").id == "td_1"
    assert Flaky.requests == ["GET /api/v1/todos/td_1/"] * 3


def test_retries_give_up_after_their_budget(flaky):
    Flaky.failures = 10
    with Client(flaky, "t", retries=2, backoff=0.001) as client, pytest.raises(Unavailable):
        client.get("td_1")
    assert len(Flaky.requests) == 3


def test_a_create_is_resent_only_with_an_idempotency_key(flaky):
    Flaky.failures = 1
    with Client(flaky, "t", backoff=0.001) as client:
        with pytest.raises(Unavailable):
            client.create("q")
        assert len(Flaky.requests) == 1
        Flaky.failures = 1
        assert client.create("q", idempotency_key="k").created
    assert len(Flaky.requests) == 3


def test_a_server_that_is_not_there_is_retried_then_named():
    with Client("http://127.0.0.1:9", "t", retries=2, backoff=0.001) as client, pytest.raises(ServerUnreachable) as e:
        client.create("q")  # never sent: safe to resend even without a key
    assert "cannot reach http://127.0.0.1:9" in str(e.value)


def test_a_429_is_retried_for_every_verb_even_a_create_without_a_key(flaky):
    # The server refused it before doing anything (a per-agent budget), so resending is always safe.
    Flaky.failures, Flaky.throttled = 1, True
    with Client(flaky, "t", backoff=0.001) as client:
        assert client.create("q").id == "td_1"
    assert len(Flaky.requests) == 2
    Flaky.failures = 10
    with Client(flaky, "t", retries=1, backoff=0.001) as client, pytest.raises(Throttled) as refused:
        client.get("td_1")
    assert refused.value.status == 429 and refused.value.limit == "AGENT_MAX_WAITS"
