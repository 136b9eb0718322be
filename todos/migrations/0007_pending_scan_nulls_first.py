"""Make the claim scan's index the only one that yields CLAIM_NEXT's order.

With the pending index on (queue, created_at) and the admin's todo_admin_recent on (created_at), the
planner could serve the claim's `ORDER BY created_at` from either; on a table whose backlog outnumbers
its history it chose the admin one and walked every done row at its head on each claim (a 45 s soak
fell from ~800 to ~290 claims/s; one claim read 10,000 buffers). Ordering the pending index
`created_at NULLS FIRST` (the column is never null, so nothing else changes) and the claim the same way
leaves the planner no other index to take. Built under a new name and swapped, concurrently, so claims
keep an index throughout.
"""

from django.db import migrations, models

NEW = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_pending_claim_scan_nf "
    "ON todos_todo (queue, created_at NULLS FIRST) WHERE state = 'pending'"
)
OLD = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_pending_claim_scan_old "
    "ON todos_todo (queue, created_at) WHERE state = 'pending'"
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0006_lighter_write_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="todo", name="todo_pending_claim_scan"),
                migrations.AddIndex(
                    model_name="todo",
                    index=models.Index(
                        models.F("queue"),
                        models.OrderBy(models.F("created_at"), nulls_first=True),
                        condition=models.Q(("state", "pending")),
                        name="todo_pending_claim_scan",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    [
                        NEW,
                        "DROP INDEX CONCURRENTLY IF EXISTS todo_pending_claim_scan",
                        "ALTER INDEX todo_pending_claim_scan_nf RENAME TO todo_pending_claim_scan",
                    ],
                    [
                        OLD,
                        "DROP INDEX CONCURRENTLY IF EXISTS todo_pending_claim_scan",
                        "ALTER INDEX todo_pending_claim_scan_old RENAME TO todo_pending_claim_scan",
                    ],
                ),
            ],
        ),
    ]
