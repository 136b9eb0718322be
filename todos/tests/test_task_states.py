"""Issue 33 item 4: one table of todo states to MCP task statuses (both wires) and A2A task states, defined
once in todos/states.py, rendered into docs/agents.md; and each todo reads as its row."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from todos import states
from todos.mcp import tasks

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def _todo(state: str, **columns: Any) -> Any:
    base: dict[str, Any] = {
        "state": state,
        "next_retry_at": None,
        "lease_expires_at": None,
        "attempt": 0,
        "max_attempts": 5,
        "run_at": None,
        "waiting_for": None,
    }
    return SimpleNamespace(**{**base, **columns})


def test_the_docs_table_is_the_codes_table():
    text = DOC.read_text()
    found = re.search(r"<!-- task-states:begin -->\n(.*?)<!-- task-states:end -->", text, re.S)
    assert found, "docs/agents.md has no task-states table between its markers"
    assert found.group(1) == states.task_state_table_markdown()


@pytest.mark.parametrize(
    ("todo", "row"),
    [
        (_todo("pending"), states.TASK_PENDING),
        (_todo("scheduled", run_at=timezone.now() + timedelta(hours=1)), states.TASK_PENDING),
        (_todo("claimed", lease_expires_at=timezone.now() + timedelta(minutes=5)), states.TASK_CLAIMED),
        (_todo("failed", next_retry_at=timezone.now() + timedelta(seconds=30)), states.TASK_CLAIMED),
        (_todo("waiting", waiting_for={"todos": ["td_x"]}), states.TASK_WAITING),
        (_todo("waiting", waiting_for={"event": {"source": "gh", "type": "push"}}), states.TASK_WAITING),
        (_todo("waiting", waiting_for={"token": True}), states.TASK_INPUT),
        (_todo("waiting", waiting_for={"people": ["ana"]}), states.TASK_INPUT),
        (_todo("done"), states.TASK_DONE),
        (_todo("failed"), states.TASK_DEAD),
        (_todo("cancelled"), states.TASK_CANCELLED),
    ],
)
def test_each_todo_reads_as_its_row_on_every_protocol(todo, row):
    assert states.task_state(todo) == row
    assert tasks.task_status(todo) == row.mcp


def test_every_displayed_state_has_a_row():
    named = {part.strip() for row in states.TASK_STATES for part in re.split(r",|\bon\b", row.todo)}
    for condition in states.DISPLAYED:
        assert any(name.startswith(condition.label) for name in named), condition.label


@pytest.mark.django_db
def test_each_rows_filter_holds_exactly_the_todos_that_read_as_it(agent, make_agent):
    from todos import queue
    from todos.models import Todo

    worker = make_agent("worker", claim=["jobs"])

    def claimed(**create: Any) -> Any:
        todo, _ = queue.create(queue="jobs", **create)
        return queue.claim(todo.id, agent=worker)

    queue.create(queue="jobs", title="pending")
    queue.create(queue="jobs", title="scheduled", delay_seconds=3600)
    claimed(title="claimed")
    retry = claimed(title="retry-waiting")
    queue.fail(retry.id, agent=worker, lease_id=retry.lease_id, error="again", retry_in_seconds=3600)
    dead = claimed(title="dead", max_attempts=1)
    queue.fail(dead.id, agent=worker, lease_id=dead.lease_id, error="dead")
    token = claimed(title="token")
    queue.wait(token.id, agent=worker, lease_id=token.lease_id, wait_for={"token": True}, timeout_seconds=600)
    first, _ = queue.create(queue="other", title="awaited")
    queue.create(queue="jobs", title="waiting on todos", depends_on=[first.id], agent=agent)
    done = claimed(title="done")
    queue.complete(done.id, agent=worker, lease_id=done.lease_id, result={})
    cancelled, _ = queue.create(queue="jobs", title="cancelled")
    queue.cancel(cancelled.id, operator="ops")

    seen = set()
    for todo in Todo.objects.filter(queue="jobs"):
        rows = [row for row in states.TASK_STATES if Todo.objects.filter(row.q, pk=todo.id).exists()]
        assert rows == [states.task_state(todo)], todo.title
        seen.add(rows[0])
    assert seen == set(states.TASK_STATES)
    submitted = states.a2a_state_q("TASK_STATE_WORKING")
    assert submitted is not None and Todo.objects.filter(submitted, queue="jobs").count() == 3
    assert states.a2a_state_q("TASK_STATE_REJECTED") is None
