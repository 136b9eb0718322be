"""The todos table carries exactly the indexes that were justified, no more: every claim and completion
is a non-HOT update that writes to each of them (docs/query-plans.md)."""

from __future__ import annotations

from django.db import connection


def test_todo_table_has_exactly_the_planned_indexes(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'todos_todo'")
        names = {row[0] for row in cursor.fetchall()}
    assert names == {
        "todos_todo_pkey",
        "todo_event",  # the event FK (partial): PROTECT checks and an event's todos
        "todo_pending_claim_scan",
        "todo_claimed_lease_expiry",
        "todo_retry_due",
        "todo_dead_letters",
        "todo_scheduled_due",  # scheduled todos coming due (migration 0012)
        "todo_runnable_idempotency_key",
        # the admin's filters and the dashboard (migrations 0004 and 0006)
        "todo_admin_recent",
        "todo_admin_kind_recent",
        "todo_admin_source_recent",
        "todo_admin_assignee_recent",
        "todo_done_recent",
        "todo_failed_recent",
        # queue controls and cancel (migration 0014): a limited queue's live leases; cancelled retention
        "todo_live_leases",
        "todo_cancelled_recent",
        # fair share (migration 0016): one key's pending todos, in claim order; pending rows only
        "todo_fair_pending",
        # named limits (issue 31, migration 0028): claimed todos naming limits, by limit (GIN); partial, so a
        # todo naming none writes nothing to it
        "todo_limit_leases",
        # start-by deadlines (issue 31, migration 0030): never-claimed todos with one, for the reaper's EXPIRE
        "todo_expiry",
        # waiting todos per queue (migration 0015): queue_stats() and the admin's filter; partial, so a
        # transition of any other state writes nothing to it
        "todo_waiting",
        # the admin's free-text title search (migration 0010; bench/admin/title_search.py, docs/benchmarks.md)
        "todo_title_trgm",
        # the admin's owner: and key: searches, one triage group, and per-queue retry reads (migration 0019)
        "todo_admin_owner_recent",
        "todo_admin_key",
        "todo_dead_last_error",
        "todo_retry_queue_due",
        # lineage (migration 0026): a parent's children and a root's tree; partial, so roots (every todo
        # created without a parent) write nothing to either
        "todo_children",
        "todo_tree",
        # cascades left over for reap_once (migration 0027): partial, a handful of rows at most
        "todo_cascade_pending",
    }


def test_the_pending_scan_and_the_key_cover_priority_and_scheduled_todos(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'todos_todo' AND indexname = ANY(%s)",
            [["todo_pending_claim_scan", "todo_runnable_idempotency_key", "todo_scheduled_due"]],
        )
        defs = dict(cursor.fetchall())
    assert "(queue, priority, run_at NULLS FIRST) WHERE ((state)::text = 'pending'" in defs["todo_pending_claim_scan"]
    assert "'scheduled'" in defs["todo_runnable_idempotency_key"]
    assert "'waiting'" in defs["todo_runnable_idempotency_key"]
    assert "(queue, run_at) WHERE ((state)::text = 'scheduled'" in defs["todo_scheduled_due"]
