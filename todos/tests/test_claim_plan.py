"""The claim scan reads the pending index, whatever other index could also give its order, and never the
todos scheduled for later.

A backlog much larger than the history once made the planner serve CLAIM_NEXT's order from the admin's
plain created_at index, walking every done row at its head on each claim (migration 0007)."""

from __future__ import annotations

import re

from django.db import connection

from todos import sql


def _plan(agent_name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN " + sql.CLAIM_NEXT,
            {
                "scopes": ["%"],
                "wanted": ["bench"],
                "agent": agent_name,
                "owner": agent_name,
                "limit": 1,
                "lease_seconds": 60.0,
            },
        )
        return "\n".join(row[0] for row in cursor.fetchall())


def test_claim_next_reads_the_pending_index_when_the_backlog_dwarfs_the_history(db):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('bench', now())")
        # 2,000 done rows first (the oldest created_at), then 40,000 pending ones: the shape of a busy
        # backlog being drained, where a created_at-ordered walk starts with all the done rows.
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, completed_at)
            SELECT 'td_' || i, 'bench', '', '', '', '{}', CASE WHEN i <= 2000 THEN 'done' ELSE 'pending' END,
                   0, 5, '[]', now() - make_interval(secs => 100000 - i), now(), CASE WHEN i <= 2000 THEN now() END
            FROM generate_series(1, 42000) i
            """
        )
        cursor.execute("ANALYZE todos_todo")
    plan = _plan("alice")
    pending_part = plan.split("CTE pending", 1)[1].split("CTE lapsed", 1)[0]
    assert "todo_pending_claim_scan" in pending_part, plan
    assert "todo_admin_recent" not in pending_part, plan


def test_claim_next_never_reads_the_todos_scheduled_for_later(db):
    """Procrastinate's trap: a scheduled_at filter applied after the index re-walks every future job on each
    fetch. Here the scheduled branch's range ends at the first future row."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('bench', now())")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority)
            SELECT 'td_' || i, 'bench', '', '', '', '{}', 'scheduled', 0, 5, '[]', now(), now(),
                   now() + make_interval(secs => i - 3), mod(i, 201) - 100
            FROM generate_series(1, 20000) i
            """
        )
        cursor.execute("ANALYZE todos_todo")
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + sql.CLAIM_NEXT,
            {"scopes": ["%"], "wanted": ["bench"], "agent": "a", "owner": "a", "limit": 5, "lease_seconds": 60.0},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    scheduled_part = plan.split("CTE scheduled", 1)[1].split("CTE lapsed", 1)[0]
    [rows] = re.findall(r"Index Scan using todo_scheduled_due .*actual rows=([\d.]+)", scheduled_part)
    assert float(rows) <= 3, plan  # the three due ones (run_at now()-2s .. now()); no future row
    [buffers] = re.findall(r"Buffers: shared hit=(\d+)", scheduled_part)[:1]
    assert int(buffers) < 20, plan
