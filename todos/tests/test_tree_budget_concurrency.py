"""Budgets under real parallelism (issue 30): 16 workers, each its own thread and PostgreSQL connection,
report usage on heartbeats of one tree's todos at once. The root's sum is the todos' sums exactly (each report
adds under the root row's lock, on its latest version), and once the budget is spent, concurrent claimers take
none of the tree's remaining todos. Checked from the rows."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest

from todos import queue
from todos.models import Agent, Todo
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 16
BEATS = 5


def _reporter(agent: Agent, todo: Todo) -> Callable[[], bool]:
    def report() -> bool:
        exhausted = False
        for _ in range(BEATS):
            beat = queue.heartbeat(
                todo.id, agent=agent, lease_id=str(todo.lease_id), usage={"tokens": 7, "cost_usd": 0.1}
            )
            exhausted = beat.tree_budget_exhausted  # type: ignore[attr-defined]
        return exhausted

    return report


def _claimer(agent: Agent) -> Callable[[], list[str]]:
    return lambda: [t.id for t in queue.claim_next(agent=agent, queues=["jobs"], limit=5)]


def test_concurrent_heartbeats_add_up_exactly_on_the_root_and_a_spent_budget_stops_claims(make_agent):
    agent = make_agent("spawner")
    root = queue.claim(queue.create(queue="jobs", budget={"tokens": 7 * BEATS * WORKERS})[0].id, agent=agent)
    parent = {"id": root.id, "lease_id": str(root.lease_id)}
    workers = [
        queue.claim(queue.create(queue="jobs", agent=agent, parent=parent)[0].id, agent=agent) for _ in range(WORKERS)
    ]
    left = [queue.create(queue="jobs", agent=agent, parent=parent)[0].id for _ in range(10)]
    outcomes = run_together([_reporter(agent, todo) for todo in workers])
    tree = Todo.objects.filter(root_id=root.id)
    summed = {"tokens": Decimal(0), "cost_usd": Decimal(0)}
    for todo in tree:
        for name, value in (todo.usage or {}).items():
            summed[name] += Decimal(str(value))
    fresh = Todo.objects.get(pk=root.id)
    assert {k: Decimal(str(v)) for k, v in fresh.tree_usage.items()} == summed
    assert summed == {"tokens": Decimal(7 * BEATS * WORKERS), "cost_usd": Decimal("0.1") * BEATS * WORKERS}
    assert fresh.budget_exhausted is True
    assert any(outcomes)  # the last reports saw the budget spent
    taken = run_together([_claimer(agent) for _ in range(4)])
    assert not {i for ids in taken for i in ids} & set(left)
    assert Todo.objects.filter(pk__in=left, state="pending").count() == len(left)


def test_a_cascade_racing_usage_reports_neither_deadlocks_nor_loses_a_report(make_agent):
    from todos.errors import TodoConflict

    agent = make_agent("spawner")
    root = queue.claim(queue.create(queue="jobs", budget={"tokens": 10**9})[0].id, agent=agent)
    parent = {"id": root.id, "lease_id": str(root.lease_id)}
    workers = [queue.claim(queue.create(queue="jobs", agent=agent, parent=parent)[0].id, agent=agent) for _ in range(8)]

    def report(todo: Todo) -> Callable[[], int]:
        def run() -> int:
            sent = 0
            for _ in range(20):
                try:
                    queue.heartbeat(todo.id, agent=agent, lease_id=str(todo.lease_id), usage={"tokens": 1})
                except TodoConflict:
                    break  # cancelled: the worker stops
                sent += 1
            return sent

        return run

    def cancel() -> int:
        return int(queue.cancel(root.id, operator="ops", cascade=True).cascaded)  # type: ignore[attr-defined]

    *sent, cascaded = run_together([*(report(t) for t in workers), cancel])
    assert cascaded == len(workers)
    assert set(Todo.objects.filter(root_id=root.id).values_list("state", flat=True)) == {"cancelled"}
    fresh = Todo.objects.get(pk=root.id)
    assert Decimal(str((fresh.tree_usage or {}).get("tokens", 0))) == sum(sent)
