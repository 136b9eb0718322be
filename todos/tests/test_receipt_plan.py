"""The statements a receipt's holder runs find their row by its primary key, never by the admin's owner index
(issue 32).

Their guard tested split_part(owner, '/', 1) = agent, which implies owner IS NOT NULL: after a backlog was
loaded and analyzed (no todo owned yet) the planner served COMPLETE from the partial
todo_admin_owner_recent (owner, created_at) WHERE owner IS NOT NULL, estimated empty, and a prepared
statement kept that plan while every completion added a row to walk (done todos keep their owner)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection

from todos import queue, sql
from todos.models import Agent


def _explain(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def loaded(db: None) -> tuple[Agent, list[Any]]:
    agent = Agent.objects.create(name="alice", claim_scopes=["*"], create_scopes=["*"])
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('bench', now())")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority)
            SELECT 'td_' || i, 'bench', '', '', '', '{}', 'pending', 0, 5, '[]', now(), now(), now(), 0
            FROM generate_series(1, 20000) i
            """
        )
        cursor.execute("ANALYZE todos_todo")  # no todo is owned yet: the owner index is estimated empty
    todos = queue.claim_next(agent=agent, queues=["bench"], limit=5)
    return agent, todos


def test_the_receipts_statements_read_the_primary_key_not_the_owner_index(loaded):
    agent, todos = loaded
    receipt = {"id": todos[0].id, "lease_id": todos[0].lease_id, "agent": agent.name, "visible": ["%"]}
    plans = {
        "COMPLETE": _explain(sql.COMPLETE, {**receipt, "result": None}),
        "HEARTBEAT": _explain(sql.HEARTBEAT, {**receipt, "lease_seconds": 60.0, "progress": None, "checkpoint": None}),
        "COMPLETE_MANY": _explain(
            sql.COMPLETE_MANY,
            {
                "ids": [t.id for t in todos],
                "lease_ids": [t.lease_id for t in todos],
                "results": [None] * len(todos),
                "agent": agent.name,
                "visible": ["%"],
            },
        ),
    }
    for name, plan in plans.items():
        assert "todo_admin_owner_recent" not in plan, (name, plan)
        assert "todos_todo_pkey" in plan, (name, plan)
    # A late complete's guard names the cancelled state, so todo_cancelled_recent (small) may serve it; never
    # the owner index.
    assert "todo_admin_owner_recent" not in _explain(sql.LATE_RESULT, {**receipt, "result": None})


def test_no_statement_tests_its_holder_on_owner_itself():
    """Every guard on the holder's agent goes through holder_is (COALESCE(owner, ''): not strict in owner)."""
    strict = re.compile(r"split_part\((\w+\.)?owner, '/', 1\)\s*=")
    for name in dir(sql):
        value = getattr(sql, name)
        if name.isupper() and isinstance(value, str):
            assert not strict.search(value), name
