"""Awaiting a result (issue 21): GET /api/v1/todos/<id>/?wait_seconds=N answers when the todo finishes
(done, dead-letter, cancelled) or when the time runs out, with the todo as it then is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from todos import queue
from todos.models import Todo
from todos.tests.gunicorn_live import start_server

__all__ = ["start_server"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)


def _await_in_thread(api, todo_id: str, wait: float) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            response = api.get(f"/todos/{todo_id}/", wait_seconds=wait)
            out["status"], out["body"] = response.status_code, response.json()
        finally:
            out["seconds"] = time.monotonic() - started
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _woken_by(api, agent, make_todo, finish: Callable[[Todo], Any]) -> dict[str, Any]:
    todo = make_todo("jobs", max_attempts=1)
    thread, out = _await_in_thread(api, todo.id, 15)
    time.sleep(0.5)  # the await is open
    assert thread.is_alive()
    finish(todo)
    thread.join(10)
    assert not thread.is_alive() and out["status"] == 200, out
    assert out["seconds"] < 5, out["seconds"]
    return dict(out["body"])


def test_an_await_is_woken_by_complete_with_the_result(api, agent, make_todo):
    def finish(todo: Todo) -> None:
        claimed = queue.claim(todo.id, agent=agent)
        queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id, result={"answer": 42})

    body = _woken_by(api, agent, make_todo, finish)
    assert body["state"] == "done" and body["result"] == {"answer": 42}


def test_an_await_is_woken_when_a_failure_dead_letters_the_todo(api, agent, make_todo):
    def finish(todo: Todo) -> None:
        claimed = queue.claim(todo.id, agent=agent)
        queue.fail(todo.id, agent=agent, lease_id=claimed.lease_id, error="broken")

    body = _woken_by(api, agent, make_todo, finish)
    assert body["state"] == "failed" and body["dead_letter"] is True


def test_an_await_is_woken_by_cancel(api, agent, make_todo):
    body = _woken_by(api, agent, make_todo, lambda todo: queue.cancel(todo.id, operator="op"))
    assert body["state"] == "cancelled"


def test_a_failure_that_will_be_retried_does_not_end_the_await(api, agent, make_todo):
    todo = make_todo("jobs", max_attempts=3)
    thread, out = _await_in_thread(api, todo.id, 1.5)
    time.sleep(0.3)
    claimed = queue.claim(todo.id, agent=agent)
    queue.fail(todo.id, agent=agent, lease_id=claimed.lease_id, error="flaky", retry_in_seconds=60)
    thread.join(10)
    assert out["body"]["state"] == "failed" and out["body"]["dead_letter"] is False
    assert out["seconds"] >= 1.4


def test_an_await_that_times_out_answers_the_todo_as_it_is(api, make_todo):
    todo = make_todo("jobs")
    started = time.monotonic()
    response = api.get(f"/todos/{todo.id}/", wait_seconds=1)
    assert response.status_code == 200 and response.json()["state"] == "pending"
    assert 0.9 <= time.monotonic() - started < 5


def test_a_finished_todo_answers_at_once(api, agent, make_todo):
    todo = make_todo("jobs")
    queue.cancel(todo.id, operator="op")
    started = time.monotonic()
    assert api.get(f"/todos/{todo.id}/", wait_seconds=20).json()["state"] == "cancelled"
    assert time.monotonic() - started < 1


def test_awaiting_a_todo_outside_the_scopes_is_404_at_once(make_agent, api_for, make_todo):
    todo = make_todo("secret")
    outsider = api_for(make_agent("outsider", claim=["jobs"]))
    started = time.monotonic()
    assert outsider.get(f"/todos/{todo.id}/", wait_seconds=5).status_code == 404
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("bad", ["21", "-1", "soon"])
def test_a_bad_wait_seconds_is_a_400_naming_it(api, make_todo, bad):
    todo = make_todo("jobs")
    response = api.get(f"/todos/{todo.id}/", wait_seconds=bad)
    assert response.status_code == 400
    assert "wait_seconds" in response.json()["error"]["fields"]
    assert Todo.objects.get(pk=todo.id).updated_at == todo.updated_at


@pytest.mark.slow
def test_on_the_real_server_50_awaits_hold_no_thread_and_all_wake_on_their_results(start_server, agent, make_todo):
    """More awaits than the process has threads (WEB_THREADS=2): other requests still answer at once, and
    each await answers when its todo is done."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    from bench.http.aio_http import Connection

    server = start_server(workers=1, env={"WEB_THREADS": "2"})
    todos = [make_todo("jobs") for _ in range(50)]

    def finish_all() -> None:
        try:
            for todo in todos:
                claimed = queue.claim(todo.id, agent=agent)
                queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id, result={"n": todo.id})
        finally:
            connections.close_all()

    async def scenario() -> list[tuple[int, Any]]:
        awaiting = [await Connection(server.base, agent.token).open() for _ in todos]
        for connection_, todo in zip(awaiting, todos, strict=True):
            await connection_.send("GET", f"/api/v1/todos/{todo.id}/?wait_seconds=20")
        await asyncio.sleep(1)
        other = await Connection(server.base, agent.token).open()
        started = time.monotonic()
        status, _ = await other.request("GET", "/api/v1/queues/")
        assert status == 200 and time.monotonic() - started < 2
        assert all(not c.reader._buffer for c in awaiting)  # type: ignore[attr-defined]  # none answered yet
        await sync_to_async(finish_all, thread_sensitive=False)()
        answers = await asyncio.wait_for(asyncio.gather(*(c.answer() for c in awaiting)), 10)
        for c in [*awaiting, other]:
            c.close()
        return answers

    answers = asyncio.run(scenario())
    assert [(status, body["state"], body["result"]) for status, body in answers] == [
        (200, "done", {"n": todo.id}) for todo in todos
    ]
