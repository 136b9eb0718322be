"""Scheduling's indexes, each built CONCURRENTLY under a new name and swapped in, so claims and creates
keep an index (and the idempotency key its arbiter) throughout.

* todo_pending_claim_scan becomes (queue, priority, run_at NULLS FIRST) WHERE pending: claims take
  priority first, then run_at. NULLS FIRST as in 0007: no other index yields that order.
* todo_scheduled_due (queue, run_at) WHERE scheduled: the claim scan's and the reaper's due range,
  which ends at the first future row.
* todo_runnable_idempotency_key covers scheduled todos too (a duplicate returns the scheduled one).
"""

from django.db import migrations, models

PENDING_NEW = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_pending_claim_scan_p "
    "ON todos_todo (queue, priority, run_at NULLS FIRST) WHERE state = 'pending'"
)
PENDING_OLD = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_pending_claim_scan_nf "
    "ON todos_todo (queue, created_at NULLS FIRST) WHERE state = 'pending'"
)
KEY_NEW = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS todo_runnable_idempotency_key_s "
    "ON todos_todo (queue, idempotency_key) WHERE idempotency_key IS NOT NULL "
    "AND (state IN ('pending', 'claimed', 'scheduled') OR (state = 'failed' AND next_retry_at IS NOT NULL))"
)
KEY_OLD = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS todo_runnable_idempotency_key_o "
    "ON todos_todo (queue, idempotency_key) WHERE idempotency_key IS NOT NULL "
    "AND (state IN ('pending', 'claimed') OR (state = 'failed' AND next_retry_at IS NOT NULL))"
)


def swap(create: str, old: str, new: str) -> list[str]:
    return [create, f"DROP INDEX CONCURRENTLY IF EXISTS {old}", f"ALTER INDEX {new} RENAME TO {old}"]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("todos", "0011_scheduling_fields_and_schedule")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="todo", name="todo_pending_claim_scan"),
                migrations.AddIndex(
                    model_name="todo",
                    index=models.Index(
                        models.F("queue"),
                        models.F("priority"),
                        models.OrderBy(models.F("run_at"), nulls_first=True),
                        condition=models.Q(("state", "pending")),
                        name="todo_pending_claim_scan",
                    ),
                ),
                migrations.RemoveConstraint(model_name="todo", name="todo_runnable_idempotency_key"),
                migrations.AddConstraint(
                    model_name="todo",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("idempotency_key__isnull", False),
                            models.Q(
                                ("state__in", ["pending", "claimed", "scheduled"]),
                                models.Q(("next_retry_at__isnull", False), ("state", "failed")),
                                _connector="OR",
                            ),
                        ),
                        fields=("queue", "idempotency_key"),
                        name="todo_runnable_idempotency_key",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    swap(PENDING_NEW, "todo_pending_claim_scan", "todo_pending_claim_scan_p"),
                    swap(PENDING_OLD, "todo_pending_claim_scan", "todo_pending_claim_scan_nf"),
                ),
                migrations.RunSQL(
                    swap(KEY_NEW, "todo_runnable_idempotency_key", "todo_runnable_idempotency_key_s"),
                    swap(KEY_OLD, "todo_runnable_idempotency_key", "todo_runnable_idempotency_key_o"),
                ),
            ],
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_scheduled_due ON todos_todo (queue, run_at) "
            "WHERE state = 'scheduled'",
            "DROP INDEX CONCURRENTLY IF EXISTS todo_scheduled_due",
            state_operations=[
                migrations.AddIndex(
                    model_name="todo",
                    index=models.Index(
                        condition=models.Q(("state", "scheduled")), fields=["queue", "run_at"], name="todo_scheduled_due"
                    ),
                ),
            ],
        ),
    ]
