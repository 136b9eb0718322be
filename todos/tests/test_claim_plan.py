"""The claim scan reads the pending index, whatever other index could also give its order, and never the
todos scheduled for later.

A backlog much larger than the history once made the planner serve CLAIM_NEXT's order from the admin's
plain created_at index, walking every done row at its head on each claim (migration 0007)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from django.db import connection, transaction

from todos import controls, queue, sql


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
    params = {"scopes": ["%"], "wanted": ["bench"], "agent": "a", "owner": "a", "limit": 5, "lease_seconds": 60.0}
    # Once first, undone: a session's first run of a statement also counts the catalog pages it loads (80-odd
    # buffers in this branch alone, on some runs), which says nothing about the rows it reads.
    with transaction.atomic():
        _explain_analyze(sql.CLAIM_NEXT, params)
        transaction.set_rollback(True)
    plan = _explain_analyze(sql.CLAIM_NEXT, params)
    scheduled_part = plan.split("CTE scheduled", 1)[1].split("CTE lapsed", 1)[0]
    [rows] = re.findall(r"Index Scan using todo_scheduled_due .*actual rows=([\d.]+)", scheduled_part)
    assert float(rows) <= 3, plan  # the three due ones (run_at now()-2s .. now()); no future row
    [buffers] = re.findall(r"Buffers: shared hit=(\d+)", scheduled_part)[:1]
    assert int(buffers) < 20, plan


@contextlib.contextmanager
def _statements() -> Iterator[list[str]]:
    """The SQL of every statement run on the connection meanwhile."""
    ran: list[str] = []

    def record(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        ran.append(statement)
        return execute(statement, params, many, context)

    with connection.execute_wrapper(record):
        yield ran


def _explain_analyze(statement: str, params: dict) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


# Fair share's CTEs and queue columns (fair_*, but not the todo's fair_key, which RETURNING hands back),
# its functions (todos_fair_*), its table (todos_fairkey) and its index (todo_fair_pending).
FAIR_SHARE = re.compile(r"\bfair_(?!key\b)\w+|todos?_fair", re.IGNORECASE)


def test_a_claim_on_a_plain_queue_runs_one_statement_whose_plan_has_no_fair_share_node(agent, make_todo):
    """Issue 22: plain queues pay nothing for fair share. Its CTEs in the claim statement cost a plain claim
    a quarter of its throughput even when they read nothing (PostgreSQL initialises every plan node)."""
    assert not FAIR_SHARE.search(sql.CLAIM_NEXT)
    make_todo("plain.q")
    with _statements() as ran:
        [todo] = queue.claim_next(agent=agent, queues=["plain.q"])
    assert ran == [sql.CLAIM_NEXT]
    make_todo("plain.q")
    params = {"scopes": ["%"], "wanted": ["plain.q"], "agent": agent.name, "owner": "a", "limit": 1}
    plan = _explain_analyze(sql.CLAIM_NEXT, {**params, "lease_seconds": 60.0})
    assert "todo_pending_claim_scan" in plan, plan
    assert not FAIR_SHARE.search(plan), plan
    assert todo.queue == "plain.q"


def test_a_claim_on_a_fair_queue_takes_nothing_in_the_plain_statement_and_then_runs_the_fair_one(agent, make_todo):
    make_todo("plain.q", priority=5)
    urgent = make_todo("fair.q", priority=-5)
    controls.set_limits("fair.q", fair=True)
    params = {"scopes": ["%"], "wanted": ["%"], "agent": agent.name, "owner": "a", "limit": 5, "lease_seconds": 60.0}
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_NEXT, params)
        assert cursor.fetchall() == [(None,) * len(sql.TODO_COLUMNS.split(","))]  # took nothing, locked nothing
    with _statements() as ran:
        todos = queue.claim_next(agent=agent, limit=1)
    assert ran[:2] == [sql.CLAIM_NEXT, sql.CLAIM_NEXT_FAIR]
    # Priority is global across a scope of a plain and a fair queue.
    assert [t.id for t in todos] == [urgent.id]


def test_a_claim_by_id_on_a_plain_queue_never_runs_the_key_lookup(agent, make_todo):
    todo = make_todo("plain.q")
    params = {"id": todo.id, "scopes": ["%"], "agent": agent.name, "owner": "a", "limit": 1, "lease_seconds": 60.0}
    plan = _explain_analyze(sql.CLAIM_ONE, params)
    # Two reads of the row, as before fair share: its queue (to find the queue's controls) and the update.
    reads = [line for line in plan.splitlines() if re.search(r"Scan .*on todos_todo ", line)]
    assert len([line for line in reads if "never executed" not in line]) == 2, plan
    [lookup] = [line for line in plan.splitlines() if "todos_fair_lock_key" in line]
    assert "never executed" in lookup, plan
    assert re.search(r"CTE claimed\n.*actual rows=1", plan), plan


def test_the_claim_statements_are_planned_once_per_connection_not_on_every_claim(agent, make_todo):
    """Issue 22's profile: the plan cache planned the prepared claims afresh on every call (a custom plan that
    knew LIMIT 1 looked cheaper than the generic one), and planning cost more than running: two plannings per
    fair claim. After its five trials it keeps the generic plan, on plain and fair queues alike."""
    make_todo("plain.q")
    make_todo("fair.q")
    controls.set_limits("fair.q", fair=True)
    with connection.cursor() as cursor:  # a backlog, whose size the plans' costs scale with
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority, fair_key)
            SELECT 'td_' || q || i, q, '', '', '', '{}', 'pending', 0, 5, '[]', now(), now(), now(), 0,
                   'k' || mod(i, 100)
            FROM generate_series(1, 20000) i CROSS JOIN unnest(ARRAY['plain.q', 'fair.q']) q
            """
        )
        cursor.execute("ANALYZE todos_todo")
    for _ in range(8):
        assert queue.claim_next(agent=agent, queues=["plain.q"])
        assert queue.claim_next(agent=agent, queues=["fair.q"])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement LIKE '%%fair_register AS%%', generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%NOT EXISTS (SELECT FROM queues k WHERE k.keyed OR k.flow OR k.limited)%%' "
            "OR statement LIKE '%%fair_register AS%%'"
        )
        plans = {fair: (generic, custom) for fair, generic, custom in cursor.fetchall()}
    assert set(plans) == {False, True}, plans  # CLAIM_NEXT (16 runs) and CLAIM_NEXT_FAIR (8), both prepared
    for generic, custom in plans.values():
        assert custom <= 5 and generic >= 3, plans


def test_a_fair_claim_after_the_first_runs_only_the_fair_statement_and_either_answer_stays_right(agent, make_todo):
    """Issue 31's cost bar: once CLAIM_NEXT has said a keyed queue is eligible for these (scopes, queues), the
    process runs CLAIM_NEXT_FAIR at once for KEYED_SCOPES_MEMO_SECONDS. A queue made plain meanwhile is still
    claimed (by the fair statement), and one made fair is found by the next probe."""
    from todos.queue.claim import _keyed_scopes as memo

    def claims_in(ran: list[str]) -> list[str]:
        return [s for s in ran if s in (sql.CLAIM_NEXT, sql.CLAIM_NEXT_FAIR)]

    for _ in range(3):
        make_todo("fair.q")
    controls.set_limits("fair.q", fair=True)
    with _statements() as ran:
        queue.claim_next(agent=agent, queues=["fair.q"])
        queue.claim_next(agent=agent, queues=["fair.q"])
    assert claims_in(ran) == [sql.CLAIM_NEXT, sql.CLAIM_NEXT_FAIR, sql.CLAIM_NEXT_FAIR]
    controls.set_limits("fair.q", fair=False)
    with _statements() as ran:
        [todo] = queue.claim_next(agent=agent, queues=["fair.q"])
    assert claims_in(ran) == [sql.CLAIM_NEXT_FAIR] and todo.queue == "fair.q"
    # Remembered scopes expire: a queue that stayed plain is asked of CLAIM_NEXT again.
    memo.update({k: v - 60 for k, v in memo.items()})
    make_todo("fair.q")
    with _statements() as ran:
        assert queue.claim_next(agent=agent, queues=["fair.q"])
    assert claims_in(ran) == [sql.CLAIM_NEXT]


def test_the_fast_fair_claim_reads_the_ready_rows_and_the_pending_head_by_index(agent):
    """Issue 31's reservations: CLAIM_FAIR_READY takes each queue's ready rows by one range scan of
    fair_ready_claim in claim order (a semi-join to the queues once made it a bitmap scan and a sort of every ready
    row: 1.4 ms a claim), and the most urgent pending todo per queue by one descent of todo_pending_claim_scan;
    no sequential scan of the todos or of the ready rows, on a realistic shape (20,000 pending, 2,000 reserved)."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at, fair) VALUES ('bench', now(), true)")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, fair_key)
            SELECT 'td_' || i, 'bench', '', '', '', '{}', 'pending', 0, 5, '[]', now(), now(),
                   now() - make_interval(secs => 100000 - i), 'k' || (i % 1000)
            FROM generate_series(1, 20000) i
            """
        )
        cursor.execute(
            """
            INSERT INTO todos_fairready (id, queue, priority, tag, fair_key)
            SELECT 'td_' || i, 'bench', 0, i, 'k' || (i % 1000) FROM generate_series(1, 2000) i
            """
        )
        cursor.execute("ANALYZE todos_todo")
        cursor.execute("ANALYZE todos_fairready")
    params = {"scopes": ["%"], "wanted": ["bench"], "agent": agent.name, "owner": "a", "limit": 1}
    plan = _explain_analyze(sql.CLAIM_FAIR_READY, {**params, "lease_seconds": 60.0})
    assert "fair_ready_claim" in plan.split("CTE ready", 1)[1].split("CTE picked", 1)[0], plan
    assert "todo_pending_claim_scan" in plan.split("CTE top", 1)[1].split("CTE ready", 1)[0], plan
    assert "Seq Scan on todos_todo" not in plan and "Seq Scan on todos_fairready" not in plan, plan
    assert "rows=1" in plan.split("CTE claimed", 1)[1], plan  # it claimed one
