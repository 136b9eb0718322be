"""The claim's budget predicate (issue 30, item 8; todos/sql/trees.py, BUDGET_OPEN): a child is marked
(budget_exhausted false) only when its tree's root has a budget, and only a marked child's claim probes its root,
by primary key. A child of a tree without a budget costs what a plain todo costs: its claim reads no root. A
budget set later on such a tree marks the children it has (set_budget, MARK_BUDGETED), so they are held by it
too, and a create racing that set_budget is marked either way. Plans checked with EXPLAIN ANALYZE."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from todos import queue, sql
from todos.models import Agent, Todo
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db


def _held(agent: Agent, **create: Any) -> Todo:
    return queue.claim(queue.create(queue="jobs", **create)[0].id, agent=agent)


def _child(agent: Agent, parent: Todo, **create: Any) -> Todo:
    receipt = {"id": parent.id, "lease_id": str(parent.lease_id)}
    return queue.create(queue="jobs", agent=agent, parent=receipt, **create)[0]


def _claim_plan(agent: Agent) -> str:
    params = {"scopes": ["%"], "wanted": ["jobs"], "agent": agent.name, "owner": "a", "limit": 1}
    with connection.cursor() as cursor:
        # An earlier test's ANALYZE writes pg_class's row estimate in place (its rollback does not undo it): on a
        # table said to be nearly empty a sequential scan of it is the planner's right choice for the probe. The
        # shape checked here is a real table's, so sequential scans are priced out; a hashed SubPlan still shows.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) " + sql.CLAIM_NEXT, {**params, "lease_seconds": 60.0})
        return "\n".join(row[0] for row in cursor.fetchall())


def _pending_branch(plan: str) -> str:
    return plan[plan.index("CTE pending") : plan.index("CTE scheduled")]


def test_a_child_is_marked_only_in_a_tree_with_a_budget(agent):
    plain_root, budgeted_root = _held(agent), _held(agent, budget={"tokens": 10})
    plain_child = _child(agent, plain_root)
    budgeted_child = queue.claim(_child(agent, budgeted_root).id, agent=agent)
    grandchild = _child(agent, budgeted_child)
    assert plain_child.budget_exhausted is None
    assert budgeted_child.budget_exhausted is False and grandchild.budget_exhausted is False
    assert Todo.objects.get(pk=grandchild.id).budget_exhausted is False


def test_the_claim_of_a_child_in_a_tree_without_a_budget_reads_no_root(agent):
    root = _held(agent)
    for _ in range(3):
        _child(agent, root)
    pending = _pending_branch(_claim_plan(agent))
    assert "Seq Scan" not in pending, pending  # never a hashed SubPlan reading the whole table
    assert "todos_todo_pkey on todos_todo b" in pending and "never executed" in pending, pending


def test_the_claim_of_a_child_in_a_budgeted_tree_probes_its_root_by_primary_key(agent):
    root = _held(agent, budget={"tokens": 10})
    for _ in range(3):
        _child(agent, root)
    pending = _pending_branch(_claim_plan(agent))
    assert "Seq Scan" not in pending and "hashed" not in pending, pending
    probe = pending[pending.index("todos_todo_pkey on todos_todo b") :]
    assert "never executed" not in probe.splitlines()[0], pending


def test_a_budget_set_on_a_tree_without_one_holds_its_existing_children(agent):
    root = _held(agent)
    worker = queue.claim(_child(agent, root).id, agent=agent)
    grandchild = _child(agent, worker)
    waiting = _child(agent, root)
    assert Todo.objects.filter(root_id=root.id, budget_exhausted__isnull=True).count() == 3
    queue.set_budget(root.id, budget={"tokens": 5})
    assert set(Todo.objects.filter(root_id=root.id).values_list("budget_exhausted", flat=True)) == {False}
    beat = queue.heartbeat(worker.id, agent=agent, lease_id=str(worker.lease_id), usage={"tokens": 5})
    assert beat.tree_budget_exhausted is True  # type: ignore[attr-defined]
    assert not {t.id for t in queue.claim_next(agent=agent, queues=["jobs"], limit=10)} & {grandchild.id, waiting.id}
    queue.set_budget(root.id, budget={"tokens": 50})
    assert {t.id for t in queue.claim_next(agent=agent, queues=["jobs"], limit=10)} == {grandchild.id, waiting.id}


@pytest.mark.django_db(transaction=True)
def test_creates_racing_a_first_budget_are_all_marked(make_agent):
    agent = make_agent("spawner")
    root = _held(agent)

    def spawn() -> int:
        for _ in range(10):
            _child(agent, root)
        return 10

    def budget() -> str:
        return queue.set_budget(root.id, budget={"tokens": 1}).id

    run_together([spawn, spawn, spawn, budget])
    marks = list(Todo.objects.filter(root_id=root.id).values_list("budget_exhausted", flat=True))
    assert len(marks) == 30 and set(marks) == {False}
