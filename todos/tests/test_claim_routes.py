"""Which claim statements a claim runs (issue 32): a plain queue's claim is CLAIM_NEXT alone, whose plan has no
queue-row lock, lease count or bucket write; a limited queue's (max_claimed, a rate) is CLAIM_NEXT's row of NULLs
marked 'limited', then CLAIM_NEXT_LIMITED; a scope with a keyed queue goes to CLAIM_NEXT_FAIR."""

from __future__ import annotations

from django.db import connection

from todos import controls, queue, sql
from todos.tests.test_claim_plan import _statements


def _plan(statement: str, wanted: str, agent: str) -> str:
    params = {"scopes": ["%"], "wanted": [wanted], "agent": agent, "owner": "a", "limit": 1, "lease_seconds": 60.0}
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, TIMING OFF) " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_plain_claim_runs_claim_next_alone_with_no_controls_node(agent, make_todo):
    make_todo("plain.q")
    make_todo("plain.q")
    plan = _plan(sql.CLAIM_NEXT, "plain.q", agent.name)
    assert "Update on todos_queue" not in plan, plan  # no bucket write
    assert "LockRows" not in plan.split("CTE pending", 1)[0], plan  # no queue row locked
    assert "todos_live_leases" not in sql.CLAIM_NEXT and "tokens" not in sql.CLAIM_NEXT
    with _statements() as ran:
        [todo] = queue.claim_next(agent=agent, queues=["plain.q"])
    assert ran == [sql.CLAIM_NEXT]
    assert todo.queue == "plain.q"


def test_a_limited_queues_claim_runs_claim_next_limited_which_keeps_the_cap(agent, make_todo):
    for _ in range(3):
        make_todo("capped.q")
    controls.set_limits("capped.q", max_claimed=2)
    with connection.cursor() as cursor:
        params = {"scopes": ["%"], "wanted": ["capped.q"], "agent": agent.name, "owner": "a", "limit": 5}
        cursor.execute(sql.CLAIM_NEXT, {**params, "lease_seconds": 60.0})
        [row] = cursor.fetchall()
    kind = [c.strip() for c in sql.TODO_COLUMNS.split(",")].index("kind")
    assert row[kind] == "limited" and all(v is None for i, v in enumerate(row) if i != kind)
    with _statements() as ran:
        todos = queue.claim_next(agent=agent, queues=["capped.q"], limit=5)
    assert ran[:2] == [sql.CLAIM_NEXT, sql.CLAIM_NEXT_LIMITED]
    assert len(todos) == 2  # max_claimed holds
    # Remembered for these (scopes, queues), as a keyed queue's are (todos/queue/claim.py): CLAIM_NEXT_LIMITED
    # at once, and it still hands a queue made fair meanwhile to CLAIM_NEXT_FAIR.
    with _statements() as ran:
        assert queue.claim_next(agent=agent, queues=["capped.q"], limit=5) == []
    assert [s for s in ran if "CLAIM" in s or "WITH" in s][:1] == [sql.CLAIM_NEXT_LIMITED]
    make_todo("capped.q")
    controls.set_limits("capped.q", max_claimed=None, fair=True)
    with _statements() as ran:
        assert len(queue.claim_next(agent=agent, queues=["capped.q"], limit=5)) == 2
    assert ran[:2] == [sql.CLAIM_NEXT_LIMITED, sql.CLAIM_NEXT_FAIR]


def test_a_scope_with_a_limited_and_a_fair_queue_goes_to_the_fair_claim(agent, make_todo):
    make_todo("capped.q", priority=5)
    urgent = make_todo("fair.q", priority=-5)
    controls.set_limits("capped.q", max_claimed=2)
    controls.set_limits("fair.q", fair=True)
    with _statements() as ran:
        todos = queue.claim_next(agent=agent, limit=1)
    assert ran[:2] == [sql.CLAIM_NEXT, sql.CLAIM_NEXT_FAIR]
    assert [t.id for t in todos] == [urgent.id]  # priority global across the scope
