"""Long-polls against the real server: gunicorn with uvicorn workers (the project's gunicorn.conf.py)
on a free port, real PostgreSQL, hundreds of concurrent waiters on raw asyncio connections."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from bench.http.aio_http import Connection
from todos import queue
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLAIM = "/api/v1/todos/claim/"
# These measure a process's capacity for waiters, one token standing for a whole fleet: the per-agent cap on
# open waits (AGENT_MAX_WAITS, tested in test_security_budgets.py) is lifted.
FLEET = {"AGENT_MAX_WAITS": "0"}


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 120))  # type: ignore[arg-type]


def _create_closing(**fields: Any) -> Todo:
    try:
        return queue.create(**fields)[0]
    finally:
        connections.close_all()  # this worker thread's connection must not outlive the call


create = sync_to_async(_create_closing, thread_sensitive=False)


async def _waiters(base: str, token: str, n: int, body: dict[str, Any]) -> list[Connection]:
    waiters = [await Connection(base, token).open() for _ in range(n)]
    for waiter in waiters:
        await waiter.send("POST", CLAIM, body)
    return waiters


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_a_round_trip_completes_while_300_clients_wait(start_server, agent):
    server = start_server(env=FLEET)

    async def scenario() -> None:
        waiters = await _waiters(server.base, agent.token, 300, {"queues": ["idle"], "wait_seconds": 20})
        statements = sync_to_async(server.claim_statements, thread_sensitive=False)

        async def all_waiting() -> bool:
            return await statements() >= 300

        await _until(all_waiting)
        client = await Connection(server.base, agent.token).open()
        status, created = await client.request("POST", "/api/v1/todos/", {"queue": "work"})
        assert status == 201
        status, claimed = await client.request("POST", CLAIM, {"queues": ["work"]})
        assert status == 200 and [t["id"] for t in claimed["todos"]] == [created["id"]]
        lease = claimed["todos"][0]["lease_id"]
        status, done = await client.request("POST", f"/api/v1/todos/{created['id']}/complete/", {"lease_id": lease})
        assert status == 200 and done["state"] == "done"
        status, _ = await client.request("GET", "/api/v1/queues/")
        assert status == 200
        # Every waiter is still waiting: none has been answered.
        assert all(w.reader is not None and not w.reader.at_eof() and not w.reader._buffer for w in waiters)  # type: ignore[attr-defined]
        for w in [*waiters, client]:
            w.close()

    run(scenario())


def test_ten_creates_wake_ten_of_200_waiters_with_about_ten_claims(start_server, agent):
    # One process: each process hears every NOTIFY and wakes one waiter of its own for it.
    server = start_server(workers=1, env=FLEET)

    async def scenario() -> None:
        waiters = await _waiters(server.base, agent.token, 200, {"queues": ["herd"], "wait_seconds": 20})
        statements = sync_to_async(server.claim_statements, thread_sensitive=False)

        async def all_waiting() -> bool:
            return await statements() >= 200

        await _until(all_waiting)
        before = await statements()
        made = {(await create(queue="herd", title=str(i))).id for i in range(10)}
        answered = []
        pending = {asyncio.ensure_future(w.answer()): w for w in waiters}
        while len(answered) < 10:
            done, _ = await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            assert done, "the creates woke nobody"
            for task in done:
                status, body = task.result()
                assert status == 200
                answered.extend(t["id"] for t in body["todos"])
                del pending[task]
        await asyncio.sleep(0.5)  # any extra wake would have claimed by now
        assert sorted(answered) == sorted(made)
        assert await statements() - before <= 10 + 3
        assert all(not task.done() for task in pending)  # the other 190 still wait
        for w in waiters:
            w.close()

    run(scenario())
    assert Todo.objects.filter(queue="herd", state=TodoState.CLAIMED).count() == 10


def test_a_client_that_hangs_up_mid_wait_claims_nothing(start_server, agent):
    server = start_server(workers=1)

    async def scenario() -> None:
        statements = sync_to_async(server.claim_statements, thread_sensitive=False)
        before = await statements()
        [gone] = await _waiters(server.base, agent.token, 1, {"queues": ["gone"], "wait_seconds": 20})

        async def waiting() -> bool:
            return await statements() > before

        await _until(waiting)
        gone.close()  # a raw socket closed mid-wait
        await asyncio.sleep(0.5)
        after_hang_up = await statements()
        todo = await create(queue="gone")
        await asyncio.sleep(1.0)
        assert await statements() == after_hang_up  # no waiter was left to wake: no claim ran
        return todo

    todo = run(scenario())
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0


def test_sigterm_answers_every_waiter_and_leaves_no_todo_claimed(start_server, agent):
    server = start_server()

    async def scenario() -> list[str]:
        waiters = await _waiters(server.base, agent.token, 50, {"queues": ["stop"], "wait_seconds": 20})
        statements = sync_to_async(server.claim_statements, thread_sensitive=False)

        async def all_waiting() -> bool:
            return await statements() >= 50

        await _until(all_waiting)
        server.proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        for i in range(5):  # work arriving during the stop
            await create(queue="stop", title=str(i))
        answers = await asyncio.gather(*(w.answer() for w in waiters))
        # Answered at the stop, long before their 20 s wait would have run out.
        assert time.monotonic() - stopped_at < 10
        assert all(status == 200 for status, _ in answers)
        for w in waiters:
            w.close()
        return [t["id"] for _, body in answers for t in body["todos"]]

    delivered = run(scenario())
    assert server.proc.wait(30) == 0
    # A claim that ran was delivered: nothing is claimed that no waiter received.
    claimed = set(Todo.objects.filter(state=TodoState.CLAIMED).values_list("id", flat=True))
    assert claimed == set(delivered)
    assert Todo.objects.filter(queue="stop").count() == 5
