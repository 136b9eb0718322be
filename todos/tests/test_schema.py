"""The todos table carries exactly the indexes docs/query-plans.md justifies, no more: every claim and
completion writes to each of them."""

from __future__ import annotations

from django.db import connection


def test_todo_table_has_exactly_the_planned_indexes(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'todos_todo'")
        names = {row[0] for row in cursor.fetchall()}
    assert names == {
        "todos_todo_pkey",
        "todos_todo_event_id_780be6bb",  # the event FK: PROTECT checks and an event's todos
        "todo_pending_claim_scan",
        "todo_claimed_lease_expiry",
        "todo_retry_due",
        "todo_dead_letters",
        "todo_runnable_idempotency_key",
    }
