"""Notify sidecars side by side (issue 29): four drains in threads, each with its own connection, send each
delivery exactly once; and concurrent completions of todos with callbacks enqueue one callback each."""

from __future__ import annotations

import threading

import pytest

from todos import queue
from todos.management.commands.notify import drain, notify_agent
from todos.models import Todo, TodoState
from todos.notices import NOTIFY_QUEUE, Notice, notify_url
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def test_four_sidecars_send_each_delivery_once(receiver):
    ids = [
        notify_url(
            url=f"{receiver.url}/{n}",
            secret="whsec_c2VjcmV0",
            notice=Notice(key=f"n{n}", event="e", subject="s", text="t"),
        )
        for n in range(40)
    ]
    results = run_together([lambda: drain(notify_agent()) for _ in range(4)])
    assert sum(r["sent"] for r in results) == 40 and sum(r["failed"] for r in results) == 0
    assert sorted(r.headers["webhook-id"] for r in receiver.requests) == sorted(ids)
    assert set(Todo.objects.filter(queue=NOTIFY_QUEUE).values_list("state", flat=True)) == {TodoState.DONE}


def test_concurrent_completions_enqueue_one_callback_each(make_agent, receiver):
    agent = make_agent("producer", claim=["jobs"])
    for _ in range(20):
        queue.create(queue="jobs", agent=agent, callback={"url": receiver.url})
    claimed = queue.claim_next(agent=agent, queues=["jobs"], limit=20)
    lock = threading.Lock()
    done: list[str] = []

    def complete(todo: Todo) -> None:
        assert todo.lease_id is not None
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
        with lock:
            done.append(todo.id)

    run_together([lambda t=t: complete(t) for t in claimed])
    callbacks = Todo.objects.filter(queue=NOTIFY_QUEUE)
    assert sorted(c.payload["todo"] for c in callbacks) == sorted(done) and len(done) == 20
