"""Per-agent budgets of server resources (issue 28, finding M3): a compromised agent's token may do what its
scopes allow, but cannot take a process from the other agents: its open long-polls and awaits, its request
rate and the size of a page it asks for are bounded, each refusal naming its limit."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.db.models.functions import Now

from bench.http.aio_http import Connection
from todos import queue
from todos.models import Agent, Todo
from todos.tests.conftest import Api
from todos.tests.gunicorn_live import Server, worker_pids
from todos.tests.mcp_live import mcp_base, mcp_client

__all__ = ["mcp_base"]  # the fixture, imported for pytest

CLAIM = "/api/v1/todos/claim/"


# --- request rate -------------------------------------------------------------------------------------
def test_an_agent_over_its_request_rate_is_refused_with_429_and_retry_after_and_others_are_not(
    settings: Any, make_agent: Callable[..., Agent], api_for: Callable[[Agent], Api]
) -> None:
    settings.AGENT_RATE_PER_SECOND = 0.01  # no refill within the test
    settings.AGENT_RATE_BURST = 3
    flooder, bystander = api_for(make_agent("flooder")), api_for(make_agent("bystander"))
    assert [flooder.get("/todos/").status_code for _ in range(3)] == [200, 200, 200]
    refused = flooder.post(CLAIM.removeprefix("/api/v1"), {"limit": 1})
    assert refused.status_code == 429, refused.content
    assert refused.json()["error"]["code"] == "throttled"
    assert refused.json()["error"]["limit"] == "AGENT_RATE_PER_SECOND"
    assert int(refused["Retry-After"]) >= 1
    assert bystander.get("/todos/").status_code == 200


# --- answer bytes -------------------------------------------------------------------------------------
def _pages(api: Api, first: str) -> list[list[str]]:
    pages, url = [], first
    while url:
        body = api.client.get(url).json()
        pages.append([row["id"] for row in body["results"]])
        url = body["next"]
    return pages


def test_a_page_of_big_todos_stops_at_the_byte_budget_and_the_cursor_goes_on_after_its_last_row(
    settings: Any, api: Api
) -> None:
    settings.API_PAGE_MAX_BYTES = 450_000
    blob = "x" * 200_000  # under MAX_PAYLOAD_BYTES; each rendered todo is a little over 200 KB
    for _ in range(5):
        queue.create(queue="big", payload={"blob": blob})
    # One transaction: every created_at is equal, so the cursor's offsets within a position are at work too.
    newest_first = list(Todo.objects.filter(queue="big").order_by("-created_at", "-id").values_list("id", flat=True))

    pages = _pages(api, "/api/v1/todos/?queue=big&page_size=100")
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]
    first = api.client.get("/api/v1/todos/?queue=big&page_size=100")
    assert len(first.content) < 450_000 + 1000

    # Backwards too: from the last page, `previous` gives the rows before it, nearest first, none twice.
    # (With distinct positions: DRF's cursor turning back inside a run of equal ones is approximate anyway.)
    for age, todo_id in enumerate(newest_first):
        Todo.objects.filter(pk=todo_id).update(created_at=Now() - timedelta(seconds=age))
    last = api.client.get(api.client.get(first.json()["next"]).json()["next"]).json()
    back = api.client.get(last["previous"]).json()
    assert [row["id"] for row in back["results"]] == newest_first[2:4]

    # One row over the budget is still sent alone, and the cursor moves past it.
    settings.API_PAGE_MAX_BYTES = 1000
    assert _pages(api, "/api/v1/todos/?queue=big") == [[todo_id] for todo_id in newest_first]


def test_a_page_holds_at_most_100_todos_whatever_page_size_asks(api: Api) -> None:
    queue.create_many([{"queue": "many"} for _ in range(120)])
    body = api.get("/todos/", queue="many", page_size=500).json()
    assert len(body["results"]) == 100 and body["next"]


# --- open long-polls and awaits, on the real server ------------------------------------------------
async def _answer(conn: Connection, timeout: float = 15) -> tuple[int, dict[str, str], Any]:
    """One response with its headers (bench.http.aio_http's answer() drops them)."""
    assert conn.reader is not None

    async def read() -> tuple[int, dict[str, str], Any]:
        assert conn.reader is not None
        status = int((await conn.reader.readline()).split()[1])
        headers = {}
        while (line := await conn.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        raw = await conn.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, json.loads(raw) if raw else None

    return await asyncio.wait_for(read(), timeout)


def _create_closing(**fields: Any) -> Todo:
    try:
        return queue.create(**fields)[0]
    finally:
        connections.close_all()  # this worker thread's connection must not outlive the call


create = sync_to_async(_create_closing, thread_sensitive=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_an_agent_over_its_open_long_polls_and_awaits_gets_429_and_every_way_out_frees_a_slot(
    start_server: Callable[..., Server], make_agent: Callable[..., Agent]
) -> None:
    server = start_server(workers=1, env={"AGENT_MAX_WAITS": "3"})
    flooder, bystander = make_agent("flooder"), make_agent("bystander")
    token: str = flooder.token  # type: ignore[attr-defined]
    awaited = queue.create(queue="elsewhere")[0]

    async def scenario() -> None:
        statements = sync_to_async(server.claim_statements, thread_sensitive=False)
        before = await statements()
        polls = [await Connection(server.base, token).open() for _ in range(3)]
        for poll in polls:
            await poll.send("POST", CLAIM, {"queues": ["cap"], "wait_seconds": 20})
        deadline = time.monotonic() + 30
        while await statements() < before + 3:  # each has taken its slot and made its first claim
            assert time.monotonic() < deadline, server.output()
            await asyncio.sleep(0.1)

        # The fourth long-poll, and an await, are refused at once, naming the limit.
        extra = await Connection(server.base, token).open()
        await extra.send("POST", CLAIM, {"queues": ["cap"], "wait_seconds": 20})
        status, headers, body = await _answer(extra, timeout=10)
        assert status == 429 and body["error"]["limit"] == "AGENT_MAX_WAITS", body
        assert headers["retry-after"] == "1"
        await extra.send("GET", f"/api/v1/todos/{awaited.id}/?wait_seconds=5")
        status, _, body = await _answer(extra, timeout=10)
        assert status == 429 and body["error"]["limit"] == "AGENT_MAX_WAITS", body
        # Another agent's budget is its own.
        other = await Connection(server.base, bystander.token).open()  # type: ignore[attr-defined]
        await other.send("POST", CLAIM, {"queues": ["cap"], "wait_seconds": 0.2})
        assert (await _answer(other))[0] == 200

        async def admitted() -> bool:
            """A short long-poll of the flooder's is let in (it times out with [] instead of a 429)."""
            await extra.send("POST", CLAIM, {"queues": ["cap"], "wait_seconds": 0.2})
            status, _, body = await _answer(extra)
            assert status in (200, 429), body
            return status == 200

        async def until_admitted() -> None:
            deadline = time.monotonic() + 15
            while not await admitted():
                assert time.monotonic() < deadline, "no slot was given back"
                await asyncio.sleep(0.1)

        async def refused() -> bool:
            await extra.send("POST", CLAIM, {"queues": ["cap"], "wait_seconds": 0.2})
            return (await _answer(extra))[0] == 429

        # A client that hangs up gives its slot back (Django cancels its view)...
        polls[0].close()
        await until_admitted()
        # ...so does a long-poll that times out (the short poll just admitted), or a new one would be refused:
        counted = await statements()
        polls[0] = await Connection(server.base, token).open()
        await polls[0].send("POST", CLAIM, {"queues": ["cap"], "wait_seconds": 20})
        while await statements() < counted + 1:
            assert time.monotonic() < deadline + 60, server.output()
            await asyncio.sleep(0.1)
        assert await refused()  # all three slots are held again
        # ...and so does one that leaves with work.
        await create(queue="cap")
        answers = [asyncio.ensure_future(_answer(poll)) for poll in polls]
        done, pending = await asyncio.wait(answers, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        status, _, body = done.pop().result()
        assert status == 200 and len(body["todos"]) == 1
        await until_admitted()
        for conn in (*polls, extra, other):
            conn.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


# --- the watchdog ---------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_pool_saturated_by_slow_requests_that_finish_is_not_restarted_by_the_watchdog(
    start_server: Callable[..., Server],
) -> None:
    """One agent's flood of slow requests queues far more work than the pool's threads: a probe queued
    behind it waited past the window, and the watchdog killed the process (every long-poll with it). The
    pool is moving, so the process must live. (A pool that finishes nothing still ends it:
    test_request_path_server.py's stall test.)"""
    window = 3.0
    server = start_server(workers=1, env={"SWITCHBOARD_TEST_HOOKS": "1", "WATCHDOG_SECONDS": str(window)})
    [worker] = worker_pids(server.proc.pid)
    # 80 clients of 0.5 s requests on 8 threads: each waits about 5 s in the queue, past the window.
    clients, seconds, until = 80, 0.5, time.monotonic() + 4 * window
    answered: list[int] = []

    async def client() -> None:
        conn = await Connection(server.base).open()
        try:
            while time.monotonic() < until:
                status, _ = await asyncio.wait_for(conn.request("GET", f"/_test/busy?seconds={seconds}"), 30)
                answered.append(status)
        finally:
            conn.close()

    async def flood() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    asyncio.run(flood())
    assert worker_pids(server.proc.pid) == {worker}, server.output()
    assert "request path stuck" not in server.output(tail=10**7)
    assert set(answered) == {200} and len(answered) >= clients


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_request_rate_holds_on_every_door_of_the_real_server_rest_long_poll_and_mcp(
    start_server: Callable[..., Server], make_agent: Callable[..., Agent]
) -> None:
    server = start_server(workers=1, env={"AGENT_RATE_PER_SECOND": "0.001", "AGENT_RATE_BURST": "2"})
    flooder, bystander = make_agent("flooder"), make_agent("bystander")
    mcp_headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }

    async def scenario() -> None:
        conn = await Connection(server.base, flooder.token).open()  # type: ignore[attr-defined]
        assert (await conn.request("GET", "/api/v1/todos/"))[0] == 200
        assert (await conn.request("GET", "/api/v1/queues/"))[0] == 200
        for method, path, body, headers in (
            ("GET", "/api/v1/todos/", None, None),
            ("POST", CLAIM, {"wait_seconds": 5}, None),  # the long-poll's own door, on the event loop
            ("POST", "/mcp", initialize, mcp_headers),
        ):
            await conn.send(method, path, body, headers)
            status, answer_headers, answer = await _answer(conn)
            assert status == 429, (path, answer)
            assert answer["error"]["limit"] == "AGENT_RATE_PER_SECOND" and int(answer_headers["retry-after"]) >= 1
        conn.close()
        other = await Connection(server.base, bystander.token).open()  # type: ignore[attr-defined]
        assert (await other.request("GET", "/api/v1/todos/"))[0] == 200
        other.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


# --- answer bytes over MCP --------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_mcp_list_todos_stops_at_the_byte_budget_and_says_so(mcp_base: str, make_agent: Callable[..., Agent]) -> None:
    agent = make_agent("lister")
    blob = "x" * 200_000
    queue.create_many([{"queue": "big", "payload": {"blob": blob}} for _ in range(25)])  # 5 MB of todos

    async def main() -> Any:
        async with mcp_client(mcp_base, agent.token) as client:  # type: ignore[attr-defined]
            return await client.call_tool("list_todos", {"queue": "big", "limit": 100})

    result = anyio.run(main)
    assert not result.is_error, result.content
    listed = result.structured_content
    assert listed["truncated"] is True and 1 <= len(listed["todos"]) < 25
    assert len(json.dumps(listed)) < 4 * 1024 * 1024 + 300_000
