"""Spawn caps under real parallelism (issue 30): 16 creators, each its own thread and PostgreSQL connection,
released together on a barrier, never pass max_children or max_descendants. Checked from the rows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from todos import controls, queue
from todos.errors import SpawnLimitReached
from todos.models import Agent, Queue, Todo
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)

CREATORS = 16


def _held(agent: Agent, **create: object) -> Todo:
    todo, _ = queue.create(queue="jobs", **create)  # type: ignore[arg-type]
    return queue.claim(todo.id, agent=agent)


def _receipt(todo: Todo) -> dict[str, str]:
    return {"id": todo.id, "lease_id": str(todo.lease_id)}


def _creator(agent: Agent, parent: Todo) -> Callable[[], str]:
    def create() -> str:
        try:
            queue.create(queue="jobs", agent=agent, parent=_receipt(parent))
        except SpawnLimitReached as refused:
            return refused.limit
        return "created"

    return create


def test_concurrent_creators_under_one_parent_never_pass_max_children(make_agent):
    agent = make_agent("spawner")
    Queue.objects.create(name="jobs")
    controls.set_limits("jobs", max_children=5)
    root = _held(agent)
    outcomes = run_together([_creator(agent, root) for _ in range(CREATORS)])
    assert sorted(outcomes) == ["created"] * 5 + ["max_children"] * (CREATORS - 5)
    assert Todo.objects.filter(parent_id=root.id).count() == 5


def test_concurrent_creators_across_one_tree_never_pass_max_descendants(make_agent):
    agent = make_agent("spawner")
    Queue.objects.create(name="jobs")
    controls.set_limits("jobs", max_descendants=10)
    root = _held(agent)
    parents = [
        queue.claim(queue.create(queue="jobs", agent=agent, parent=_receipt(root))[0].id, agent=agent) for _ in range(4)
    ]
    outcomes = run_together([_creator(agent, parents[n % 4]) for n in range(CREATORS)])
    assert sorted(outcomes) == ["created"] * 6 + ["max_descendants"] * (CREATORS - 6)
    assert Todo.objects.filter(root_id=root.id).count() == 10
    assert Todo.objects.get(pk=root.id).descendants == 10
