"""Lock order in a tree (issue 30, item 8): every path that locks more than one row of a tree takes the
ancestor first (the root, then the parent, then what is below it), so a parent with children: "cancel"
finishing while its children report usage, a cascading cancel racing those reports, and a create under a
parent racing the parent's own usage report never wait for each other crosswise. Real threads, each its own
PostgreSQL connection; a deadlock would show as a 503 (the finish) or as PostgreSQL's deadlock counter going up
(a heartbeat is run again once, hiding it from its caller), so both are checked."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.db import connection

from todos import queue
from todos.errors import TodoConflict
from todos.models import Agent, Todo
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)

CHILDREN = 6
ROUNDS = 6


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _flushed(before: int) -> int:
    """The deadlock counter once the threads' backends (closed by run_together) have flushed their
    statistics, which they do as they exit: polled for a moment, as exits are asynchronous."""
    deadline = time.monotonic() + 1.5
    now = _deadlocks()
    while now == before and time.monotonic() < deadline:
        time.sleep(0.1)
        now = _deadlocks()
    return now


def _reports(agent: Agent, todo: Todo, beats: int = 15) -> Callable[[], int]:
    def run() -> int:
        sent = 0
        for _ in range(beats):
            try:
                queue.heartbeat(todo.id, agent=agent, lease_id=str(todo.lease_id), usage={"tokens": 1})
            except TodoConflict:
                break  # cancelled under it: the worker stops
            sent += 1
        return sent

    return run


def _tree(agent: Agent, child: dict[str, object] | None = None, **root: object) -> tuple[Todo, list[Todo]]:
    top = queue.claim(queue.create(queue="jobs", **root)[0].id, agent=agent)  # type: ignore[arg-type]
    receipt = {"id": top.id, "lease_id": str(top.lease_id)}
    children = [
        queue.claim(queue.create(queue="jobs", agent=agent, parent=receipt, **(child or {}))[0].id, agent=agent)  # type: ignore[arg-type]
        for _ in range(CHILDREN)
    ]
    return top, children


def _waiting_tree(agent: Agent, **child: object) -> tuple[Todo, list[Todo]]:
    """A fan-in: the root waits for its children (a holder's wait on todos)."""
    top, children = _tree(agent, child)
    queue.wait(
        top.id,
        agent=agent,
        lease_id=str(top.lease_id),
        wait_for={"todos": [c.id for c in children]},
        timeout_seconds=600,
    )
    return top, children


def test_a_parent_finishing_with_children_cancel_races_usage_reports_without_a_deadlock(make_agent):
    agent = make_agent("spawner")
    before = _deadlocks()
    for _ in range(ROUNDS):
        top, children = _tree(agent, children="cancel", budget={"tokens": 10**9})

        def finish(top: Todo = top) -> str:
            return queue.complete(top.id, agent=agent, lease_id=str(top.lease_id), result={"ok": True}).state

        *sent, finished = run_together([*(_reports(agent, c) for c in children), finish])
        assert finished == "done"  # never a 503: the finish was not the deadlock's victim
        assert set(Todo.objects.filter(parent_id=top.id).values_list("state", flat=True)) == {"cancelled"}
        fresh = Todo.objects.get(pk=top.id)
        assert int((fresh.tree_usage or {}).get("tokens", 0)) == sum(sent)
    assert _flushed(before) == before  # nor a heartbeat, run again after one


def test_a_middle_parent_finishing_with_usage_races_its_childrens_reports_without_a_deadlock(make_agent):
    agent = make_agent("spawner")
    before = _deadlocks()
    for _ in range(ROUNDS // 2):
        root = queue.claim(queue.create(queue="jobs", budget={"tokens": 10**9})[0].id, agent=agent)
        middle = queue.claim(
            queue.create(
                queue="jobs", agent=agent, parent={"id": root.id, "lease_id": str(root.lease_id)}, children="cancel"
            )[0].id,
            agent=agent,
        )
        receipt = {"id": middle.id, "lease_id": str(middle.lease_id)}
        children = [
            queue.claim(queue.create(queue="jobs", agent=agent, parent=receipt)[0].id, agent=agent)
            for _ in range(CHILDREN)
        ]

        def finish(middle: Todo = middle) -> str:
            return queue.complete(middle.id, agent=agent, lease_id=str(middle.lease_id), usage={"tokens": 5}).state

        *sent, finished = run_together([*(_reports(agent, c) for c in children), finish])
        assert finished == "done"
        fresh = Todo.objects.get(pk=root.id)
        assert int((fresh.tree_usage or {}).get("tokens", 0)) == sum(sent) + 5
    assert _flushed(before) == before


def test_creates_under_a_parent_race_its_own_usage_reports_without_a_deadlock(make_agent):
    agent = make_agent("spawner")
    before = _deadlocks()
    root = queue.claim(queue.create(queue="jobs", budget={"tokens": 10**9})[0].id, agent=agent)
    middle = queue.claim(
        queue.create(queue="jobs", agent=agent, parent={"id": root.id, "lease_id": str(root.lease_id)})[0].id,
        agent=agent,
    )
    receipt = {"id": middle.id, "lease_id": str(middle.lease_id)}

    def spawn() -> int:
        for _ in range(15):
            queue.create(queue="jobs", agent=agent, parent=receipt)
        return 15

    made = run_together([spawn, spawn, _reports(agent, middle), _reports(agent, root)])
    assert made[:2] == [15, 15] and made[2:] == [15, 15]
    assert Todo.objects.filter(parent_id=middle.id).count() == 30
    assert _flushed(before) == before


def test_a_cascading_cancel_races_usage_reports_without_a_deadlock(make_agent):
    agent = make_agent("spawner")
    before = _deadlocks()
    for _ in range(ROUNDS // 2):
        top, children = _tree(agent, budget={"tokens": 10**9})

        def cancel(top: Todo = top) -> int:
            return int(queue.cancel(top.id, operator="ops", cascade=True).cascaded)  # type: ignore[attr-defined]

        *sent, cascaded = run_together([*(_reports(agent, c) for c in children), cancel])
        assert cascaded == CHILDREN
        fresh = Todo.objects.get(pk=top.id)
        assert int((fresh.tree_usage or {}).get("tokens", 0)) == sum(sent)
    assert _flushed(before) == before


def _settle(agent: Agent, child: Todo, step: str) -> Callable[[], str]:
    """The child's complete, or its fail at its attempt cap (a dead-letter settles a wait as a complete does)."""

    def run() -> str:
        try:
            if step == "complete":
                return queue.complete(child.id, agent=agent, lease_id=str(child.lease_id), result={}).state
            return queue.fail(child.id, agent=agent, lease_id=str(child.lease_id), error="boom").state
        except TodoConflict as refused:
            return refused.state

    return run


@pytest.mark.parametrize(("step", "settled"), [("complete", "done"), ("fail", "failed")])
def test_a_cascading_cancel_races_what_settles_its_waiting_parent_without_a_deadlock(make_agent, step, settled):
    # Fan-in: the root waits for its children (a holder's wait on todos); each child's complete, or its
    # dead-letter, settles that wait, locking the root after the child, while the cancel locks the root before
    # its descendants.
    agent = make_agent("spawner")
    before = _deadlocks()
    for _ in range(ROUNDS // 2):
        top, children = _waiting_tree(agent, max_attempts=1)

        def cancel(top: Todo = top) -> str:
            return queue.cancel(top.id, operator="ops", cascade=True).state

        *finished, cancelled = run_together([*(_settle(agent, c, step) for c in children), cancel])
        assert cancelled == "cancelled" and set(finished) <= {settled, "cancelled"}
    assert _flushed(before) == before
