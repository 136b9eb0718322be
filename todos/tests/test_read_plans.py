"""Reads that must not walk other queues' or other states' rows: the plans of queue_stats(), the
long-poll's next wake and the admin's exact searches use an index whose leading column is what they
ask for (issue 24, items 13 and 14; docs/query-plans.md has the plans at 1M rows)."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.db import connection
from django.test import RequestFactory

from todos import sql
from todos.models import Todo, last_error

# VACUUM (as autovacuum would leave the table) cannot run inside a test's transaction.
pytestmark = pytest.mark.django_db(transaction=True)

ALL = ["%"]


def _explain(statement: str, params: dict[str, object]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def many_retries_elsewhere() -> None:
    """5,000 retries due soon in queue 'busy', one due later in 'mine', 3,000 dead-letters in forty
    kinds of last error, and 17,000 done todos."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('busy', now()), ('mine', now())")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, next_retry_at, completed_at, owner,
                                    idempotency_key)
            SELECT 'td_' || i, CASE WHEN i = 1 THEN 'mine' ELSE 'busy' END, '', '', '', '{}',
                   CASE WHEN i <= 8001 THEN 'failed' ELSE 'done' END, 1, 5,
                   CASE WHEN i <= 8001 THEN jsonb_build_array(jsonb_build_object('error', 'cause ' || (i % 40)))
                        ELSE '[]' END,
                   now() - make_interval(secs => i), now(), now(),
                   CASE WHEN i = 1 THEN now() + interval '1 hour'
                        WHEN i <= 5001 THEN now() + make_interval(secs => i) END,
                   CASE WHEN i > 8001 THEN now() END, 'agent-' || (i % 50), 'key-' || i
            FROM generate_series(1, 25001) i
            """
        )
        cursor.execute("VACUUM ANALYZE todos_todo")


def _retry_rows_read(plan: str) -> list[float]:
    return [float(n) for n in re.findall(r"Index (?:Only )?Scan using todo_retry\w* .*actual rows=([\d.]+)", plan)]


def test_the_long_polls_next_due_retry_is_one_descent_of_its_queue(many_retries_elsewhere):
    plan = _explain(sql.SECONDS_UNTIL_CLAIMABLE, {"scopes": ALL, "wanted": ["mine"], "agent": "a"})
    assert "todo_retry_queue_due" in plan, plan
    assert _retry_rows_read(plan) and max(_retry_rows_read(plan)) <= 1, plan  # not busy's 5,000


def test_queue_stats_counts_retries_from_the_queues_own_entries(many_retries_elsewhere):
    plan = _explain(sql.QUEUE_STATS, {"visible": ["mine"]})
    retrying = plan.split("CTE retrying", 1)[1].split("CTE dead", 1)[0] if "CTE retrying" in plan else plan
    assert "todo_retry_queue_due" in retrying, plan
    assert max(_retry_rows_read(retrying)) <= 1, plan


@pytest.mark.parametrize(
    ("term", "index"),
    [("owner:agent-7", "todo_admin_owner_recent"), ("key:key-20000", "todo_admin_key")],
)
def test_the_admins_exact_searches_are_index_lookups(many_retries_elsewhere, admin_user, term, index):
    request = RequestFactory().get("/admin/todos/todo/", {"q": term})
    request.user = admin_user
    model_admin = admin.site.get_model_admin(Todo)
    found, _ = model_admin.get_search_results(request, Todo.objects.order_by("-created_at"), term)
    plan = found[:100].explain()
    assert index in plan, plan
    assert "Seq Scan" not in plan, plan


def test_one_triage_group_of_dead_letters_is_an_index_lookup(many_retries_elsewhere):
    group = Todo.objects.dead_lettered().annotate(sb=last_error()).filter(sb="cause 7")
    plan = group.order_by("-created_at")[:100].explain()
    assert "todo_dead_last_error" in plan, plan
    assert group.count() == 75


def test_a_claims_due_retries_are_one_descent_per_queue_never_other_queues_due_rows():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO todos_queue (name, created_at) VALUES ('busy', now()), ('mine', now())")
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, next_retry_at)
            SELECT 'td_' || i, CASE WHEN i = 1 THEN 'mine' ELSE 'busy' END, '', '', '', '{}', 'failed', 1, 5, '[]',
                   now(), now(), now(), now() - make_interval(secs => CASE WHEN i = 1 THEN 1 ELSE 10000 - i END)
            FROM generate_series(1, 3001) i
            """
        )
        cursor.execute("VACUUM ANALYZE todos_todo")
    params = {"scopes": ALL, "wanted": ["mine"], "agent": "a", "owner": "a", "limit": 1, "lease_seconds": 60.0}
    plan = _explain(sql.CLAIM_NEXT, params)
    due = plan.split("CTE due", 1)[1].split("CTE chosen", 1)[0]  # the next CTE in the plan (candidates is inlined)
    assert "todo_retry_queue_due" in due and "Sort" not in due, plan
    assert max(_retry_rows_read(due)) <= 1, plan  # mine's one due retry, none of busy's 3,000
