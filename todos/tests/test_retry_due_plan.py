"""The plain claim's due-retry branch is one descent of todo_retry_queue_due on any statistics (issue 32).

On a queue analyzed with no failed todo at all, both partial indexes that the branch's guard implies were
estimated empty, and the planner served the branch from todo_failed_recent (updated_at) WHERE failed plus a
Sort: after 50,000 dead-letters of another queue arrived, before the next ANALYZE, every claim filtered all
of them (6.3 ms of a 7.4 ms claim, bench/claim/pg_cpu.py). todo_failed_recent now holds dead-letters only
(migration 0042), a predicate that the branch's guard (next_retry_at IS NOT NULL) can never imply."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from todos import sql
from todos.models import Agent

DEAD = 5000


def _plan(statement: str, params: dict[str, Any]) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        (row,) = cursor.fetchall()
        document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        return dict(document[0]["Plan"])


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


@pytest.fixture
def analyzed_then_dead_letters(db: None) -> Agent:
    agent = Agent.objects.create(name="alice", claim_scopes=["*"], create_scopes=["*"])
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('bench', now()), ('other', now())")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority)
            SELECT 'td_' || i, 'bench', '', '', '', '{}', 'pending', 0, 5, '[]', now(), now(), now(), 0
            FROM generate_series(1, 20000) i
            """
        )
        cursor.execute("ANALYZE todos_todo")  # no failed todo: every failed-row partial index looks empty
        cursor.execute(
            f"""
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority)
            SELECT 'dl_' || i, 'other', '', '', '', '{{}}', 'failed', 5, 5, '[]', now(), now(), now(), 0
            FROM generate_series(1, {DEAD}) i
            """
        )
    return agent


def test_the_due_branch_reads_todo_retry_queue_due_not_the_dead_letters(analyzed_then_dead_letters: Agent) -> None:
    agent = analyzed_then_dead_letters
    params = {
        "scopes": ["%"],
        "wanted": ["bench"],
        "agent": agent.name,
        "owner": agent.name,
        "limit": 1,
        "lease_seconds": 60.0,
    }
    for name in ("CLAIM_NEXT", "CLAIM_NEXT_LIMITED"):
        nodes = _nodes(_plan(getattr(sql, name), params))
        assert not [n for n in nodes if n.get("Index Name") == "todo_failed_recent"], name
        due = [n for n in nodes if n.get("Index Name") == "todo_retry_queue_due"]
        assert due, name
        removed = sum(int(n.get("Rows Removed by Filter", 0)) for n in nodes)
        assert removed < DEAD // 10, (name, removed)


@pytest.fixture
def history(db: None) -> None:
    """Many dead-letters, a few retry-waiting todos and a backlog, analyzed."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('bench', now())")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority, next_retry_at)
            SELECT 'td_' || i, 'bench', '', '', '', '{}', CASE WHEN mod(i, 4) = 0 THEN 'pending' ELSE 'failed' END,
                   1, 5, '[]', now() - make_interval(days => mod(i, 200)), now() - make_interval(days => mod(i, 200)),
                   now(), 0, CASE WHEN mod(i, 100) = 1 THEN now() + interval '1 hour' END
            FROM generate_series(1, 20000) i
            """
        )
        cursor.execute("ANALYZE todos_todo")


def test_the_index_users_still_read_an_index_not_the_table(history: None) -> None:
    """Narrowed to dead-letters, todo_failed_recent still serves retention's purge of dead-letters; the
    dashboard's failures per minute read a dead-letter index (todo_failed_recent's range, or todo_dead_letters
    index-only, one search per queue) and todo_retry_due: never a scan of the table."""
    purge = _nodes(_plan(sql.PURGE_DEAD, {"dead_age": 90 * 86400, "batch": 1000}))
    assert [n for n in purge if n.get("Index Name") == "todo_failed_recent"], purge
    per_minute = _nodes(_plan(sql.PER_MINUTE, {"minutes": 60}))
    names = {n.get("Index Name") for n in per_minute}
    assert names & {"todo_failed_recent", "todo_dead_letters"}, per_minute
    assert not [n for n in per_minute if n["Node Type"] == "Seq Scan"], per_minute
