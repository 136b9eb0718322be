"""The request path under an ordinary mix of agents, on the Procfile's server (gunicorn + uvicorn workers)
and real PostgreSQL: long-polls, plain claims, batch claims, creates, completes, an admin page and MCP
calls at once. Under the old single-thread handler this mix hung both processes for good (issue 19)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from bench.http.aio_http import Connection
from todos.models import Agent, Todo, TodoState
from todos.tests.gunicorn_live import Server, worker_pids
from todos.tests.pgbouncer_support import POOL_SIZE, PgBouncer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLAIM = "/api/v1/todos/claim/"
QUEUE = "mix"
# The 20 s; MIXED_LOAD_SECONDS shortens a local run.
SECONDS = float(os.environ.get("MIXED_LOAD_SECONDS", "20"))
# No single request may take this long: a hung process fails the test instead of hanging it.
REQUEST_TIMEOUT = 15.0
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}


class Load:
    """Every actor's tally: todos made and finished, and /healthz latencies."""

    def __init__(self) -> None:
        self.created: set[str] = set()
        self.completed: set[str] = set()
        self.healthz: list[float] = []
        self.counts: dict[str, int] = {}
        self.producing = True

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


@contextlib.asynccontextmanager
async def _connection(server: Server, token: str | None = None) -> AsyncIterator[Connection]:
    conn = await Connection(server.base, token).open()
    try:
        yield conn
    finally:
        conn.close()


async def _call(conn: Connection, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    return await asyncio.wait_for(conn.request(method, path, body, **kw), REQUEST_TIMEOUT)


async def _complete(conn: Connection, load: Load, todos: list[dict[str, Any]], batch: bool = False) -> None:
    if not todos:
        return
    if batch:
        items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in todos]
        status, body = await _call(conn, "POST", "/api/v1/todos/complete/", {"items": items})
        assert status == 200, body
    else:
        for todo in todos:
            status, body = await _call(
                conn, "POST", f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]}
            )
            assert status == 200, body
    load.completed.update(t["id"] for t in todos)


def _finished(load: Load) -> bool:
    return not load.producing and load.created <= load.completed


async def _long_poller(server: Server, token: str, load: Load) -> None:
    async with _connection(server, token) as conn:
        while not _finished(load):
            status, body = await _call(conn, "POST", CLAIM, {"queues": [QUEUE], "wait_seconds": random.uniform(1, 2)})
            assert status == 200, body
            load.count("long-poll")
            await _complete(conn, load, body["todos"])


async def _claimer(server: Server, token: str, load: Load, limit: int = 1) -> None:
    async with _connection(server, token) as conn:
        while not _finished(load):
            status, body = await _call(conn, "POST", CLAIM, {"queues": [QUEUE], "limit": limit})
            assert status == 200, body
            load.count("batch claim" if limit > 1 else "claim")
            await _complete(conn, load, body["todos"], batch=limit > 1)
            if not body["todos"]:
                await asyncio.sleep(0.02)


async def _producer(server: Server, token: str, load: Load, until: float) -> None:
    async with _connection(server, token) as conn:
        while time.monotonic() < until:
            status, body = await _call(conn, "POST", "/api/v1/todos/", {"queue": QUEUE, "title": "mixed"})
            assert status == 201, body
            load.created.add(body["id"])
            await asyncio.sleep(0.01)


async def _admin(server: Server, session: str, load: Load, until: float) -> None:
    async with _connection(server) as conn:
        while time.monotonic() < until:
            status, page = await _call(conn, "GET", "/admin/todos/todo/", headers={"Cookie": f"sessionid={session}"})
            assert status == 200, page
            load.count("admin")
            await asyncio.sleep(0.2)


async def _mcp(server: Server, token: str, load: Load, until: float) -> None:
    """Alternately a read and a long-poll claim over MCP; what it claims it completes over REST."""
    async with _connection(server, token) as conn:
        n = 0
        while time.monotonic() < until:
            n += 1
            if n % 2:
                params: dict[str, Any] = {"name": "list_queues", "arguments": {}}
            else:
                params = {"name": "claim", "arguments": {"queues": [QUEUE], "wait_seconds": 1}}
            call = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
            status, body = await _call(conn, "POST", "/mcp", call, headers=MCP_HEADERS)
            assert status == 200 and not body["result"].get("isError"), body
            load.count("mcp")
            claimed = body["result"]["structuredContent"].get("todo")
            await _complete(conn, load, [claimed] if claimed else [])
            await asyncio.sleep(0.1)


async def _prober(server: Server, load: Load, until: float) -> None:
    async with _connection(server) as conn:
        while time.monotonic() < until:
            started = time.monotonic()
            status, body = await _call(conn, "GET", "/healthz")
            assert status == 200, body
            load.healthz.append(time.monotonic() - started)
            await asyncio.sleep(0.1)


def mixed_load(server: Server, agent: Agent, session: str) -> Load:
    load = Load()
    token: str = agent.token  # type: ignore[attr-defined]

    async def scenario() -> None:
        until = time.monotonic() + SECONDS
        producers = [_producer(server, token, load, until) for _ in range(2)]
        workers: list[Awaitable[None]] = [
            *(_long_poller(server, token, load) for _ in range(8)),
            *(_claimer(server, token, load) for _ in range(8)),
            *(_claimer(server, token, load, limit=5) for _ in range(2)),
            _admin(server, session, load, until),
            _mcp(server, token, load, until),
            _prober(server, load, until + 5),
        ]

        async def produce() -> None:
            try:
                await asyncio.gather(*producers)
            finally:
                load.producing = False

        await asyncio.gather(produce(), *workers)

    try:
        asyncio.run(asyncio.wait_for(scenario(), SECONDS + 60))
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{exc!r}; {load.counts}; the server's log:\n{server.output()}") from exc
    return load


@pytest.fixture
def staff_session(db: None) -> str:
    user = User.objects.create_superuser("ops", "ops@example.com", "a-long-password-1")
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _check(load: Load, server: Server) -> None:
    assert load.created, "nothing was created"
    assert load.created <= load.completed
    done = set(Todo.objects.filter(queue=QUEUE, state=TodoState.DONE).values_list("id", flat=True))
    assert done == load.created == set(Todo.objects.filter(queue=QUEUE).values_list("id", flat=True))
    for actor in ("long-poll", "claim", "batch claim", "admin", "mcp"):
        assert load.counts.get(actor, 0) > 0, (actor, load.counts)
    # /healthz answered every probe, quickly, throughout.
    assert max(load.healthz) < 2.0, (max(load.healthz), statistics.median(load.healthz))


def test_a_mixed_load_of_long_polls_claims_admin_and_mcp_keeps_the_server_answering(
    start_server: Callable[..., Server], agent: Agent, staff_session: str
) -> None:
    server = start_server()
    load = mixed_load(server, agent, staff_session)
    _check(load, server)


@pytest.mark.parametrize("what", ["loop", "pool"])
def test_a_worker_whose_request_path_stalls_is_replaced_by_gunicorn_within_the_watchdogs_window(
    start_server: Callable[..., Server], what: str
) -> None:
    window = 3.0
    server = start_server(workers=1, env={"SWITCHBOARD_TEST_HOOKS": "1", "WATCHDOG_SECONDS": str(window)})
    [stuck] = worker_pids(server.proc.pid)

    async def stall() -> None:
        conn = await Connection(server.base).open()
        await conn.send("POST", f"/_test/stall/{what}?seconds=120")
        stalled_at = time.monotonic()
        # The worker ends within the window (plus one probe interval and a loaded machine's slack)...
        while stuck in worker_pids(server.proc.pid):
            assert time.monotonic() - stalled_at < window + 1 + 4, "the stuck worker is still running"
            await asyncio.sleep(0.1)
        conn.close()

    asyncio.run(stall())
    # ...and gunicorn starts another, which serves.
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(server.base + "/healthz", timeout=5) as response:  # noqa: S310 (local)
                assert json.load(response) == {"status": "ok", "database": "ok"}
                break
        except OSError:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
    assert stuck not in worker_pids(server.proc.pid) and len(worker_pids(server.proc.pid)) == 1
    assert "request path stuck" in server.output(tail=10**7)


def test_the_mixed_load_through_pgbouncer_in_transaction_mode_leaves_nothing_on_its_server_connections(
    start_server: Callable[..., Server], agent: Agent, staff_session: str, pgbouncer: PgBouncer
) -> None:
    s = connection.settings_dict
    server = start_server(
        env={
            "DATABASE_URL": pgbouncer.url(s["NAME"]),
            # LISTEN goes to PostgreSQL itself: PgBouncer would lend its connection to others.
            "LISTEN_DATABASE_URL": f"postgres://{s['USER']}@/{s['NAME']}?host={s['HOST']}",
            # PgBouncer 1.18 keeps neither prepared statements nor server-side cursors across transactions.
            "DATABASE_PREPARED_STATEMENTS": "false",
            "DATABASE_DISABLE_SERVER_SIDE_CURSORS": "true",
        }
    )
    load = mixed_load(server, agent, staff_session)
    _check(load, server)
    # Every server connection PgBouncer holds (one per concurrent transaction, up to its pool size): no
    # prepared statement, cursor, LISTEN or SET left behind by any request.
    clients = [psycopg.connect(pgbouncer.url(s["NAME"]), prepare_threshold=None) for _ in range(POOL_SIZE)]
    try:
        seen = set()
        for conn in clients:  # each holds its transaction open: each is on its own server connection
            row = conn.execute(
                "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements),"
                " (SELECT count(*) FROM pg_cursors), (SELECT count(*) FROM pg_listening_channels()),"
                " current_setting('statement_timeout')"
            ).fetchone()
            assert row is not None and row[1:] == (0, 0, 0, "0"), row
            seen.add(row[0])
        assert len(seen) == POOL_SIZE
    finally:
        for conn in clients:
            conn.close()
