"""The statements of waits for people read only what they are about (issue 29): the reaper's reminder and
escalation sweeps, and the inbox, go through their partial indexes, never through the many closed waits."""

from __future__ import annotations

import pytest
from django.db import connection

from todos import sql

# VACUUM (as autovacuum would leave the table) cannot run inside a test's transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def _explain(statement: str, params: dict[str, object]) -> str:
    # Without ANALYZE: the sweeps write; the plan is what is asked.
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def many_closed_waits() -> None:
    """20,000 closed waits (token and people alike, reminded or not) and 5 open people waits, due."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos_waitpoint (todo_id, queue, created_at, timeout_at, on_timeout, resolved_at, people,
                                         decider_users, decider_groups, escalate_groups, remind_at, escalate_at)
            SELECT 'td_' || i, 'q', now() - make_interval(secs => i), now() + interval '1 day', 'pending',
                   CASE WHEN i > 5 THEN now() END,
                   CASE WHEN i % 2 = 0 OR i <= 5 THEN '{"title": "t"}'::jsonb END,
                   ARRAY[1], ARRAY[]::int[], ARRAY[2], now() - interval '1 minute', now() - interval '1 minute'
            FROM generate_series(1, 20005) i
            """
        )
        cursor.execute("VACUUM ANALYZE todos_waitpoint")


def test_the_reminder_and_escalation_sweeps_use_their_due_indexes(many_closed_waits):
    params = {"batch": 500, "what": "people reminded", "entry": "{}"}
    assert "waitpoint_remind_due" in _explain(sql.REMIND_PEOPLE, params)
    assert "waitpoint_escalate_due" in _explain(sql.ESCALATE_PEOPLE, params)


def test_the_inbox_reads_open_people_waits_only(many_closed_waits):
    plan = _explain(sql.INBOX, {"operator": False, "user_id": 1, "groups": [], "limit": 500})
    assert "waitpoint_open_people" in plan, plan
