"""Shared fixtures: agents, and a factory for todos in any state (rows are aged with the database's
clock instead of freezing time, as river's testfactory does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from todos import queue
from todos.models import Agent, Todo

_CREATE_ARGS = {
    "kind",
    "payload",
    "idempotency_key",
    "assignee",
    "max_attempts",
    "source",
    "run_at",
    "delay_seconds",
    "priority",
}


@pytest.fixture
def make_agent(db: None) -> Callable[..., Agent]:
    def make(name: str = "worker", claim: list[str] | None = None, create: list[str] | None = None, **kw: Any) -> Agent:
        agent = Agent(
            name=name,
            claim_scopes=claim if claim is not None else ["*"],
            create_scopes=create if create is not None else (claim if claim is not None else ["*"]),
            **kw,
        )
        agent.token = agent.set_new_token()  # type: ignore[attr-defined]
        agent.save()
        return agent

    return make


@pytest.fixture
def agent(make_agent: Callable[..., Agent]) -> Agent:
    return make_agent("alice")


@pytest.fixture
def make_todo(db: None) -> Callable[..., Todo]:
    def make(queue_name: str = "default", **overrides: Any) -> Todo:
        create_args = {k: overrides.pop(k) for k in list(overrides) if k in _CREATE_ARGS}
        todo, _ = queue.create(queue=queue_name, title=overrides.pop("title", "a todo"), **create_args)
        if "created_at" in overrides and "run_at" not in overrides and todo.state == "pending":
            # An unscheduled todo's run_at is its creation time: aging one ages the other.
            overrides["run_at"] = overrides["created_at"]
        if overrides:
            Todo.objects.filter(pk=todo.pk).update(**overrides)
            todo.refresh_from_db()
        return todo

    return make
