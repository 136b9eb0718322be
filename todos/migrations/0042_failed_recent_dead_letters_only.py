"""todo_failed_recent holds dead-letters only, so the claim's due-retry branch can never be served from it.

The claim's due branch (todos/sql/claim.py, RETRY_DUE: state = 'failed' AND next_retry_at IS NOT NULL AND
next_retry_at <= now()) implied this index's old predicate (state = 'failed'). On a table analyzed with no
failed row, it and todo_retry_queue_due were both estimated empty, and the planner served the branch from
this index plus a Sort: after 50,000 dead-letters of another queue arrived, before the next ANALYZE, every
claim filtered all of them (6.3 ms of a 7.4 ms claim, bench/claim/pg_cpu.py). next_retry_at IS NULL is a
predicate that guard can never imply. Its users read dead-letters (retention, the event feed, the admin) or,
for the dashboard's retry-waiting failures, todo_retry_due. Built under a new name and swapped,
concurrently, so retention and the dashboard keep an index throughout.
"""

from django.db import migrations, models

NEW = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_failed_recent_dead "
    "ON todos_todo (updated_at) WHERE (next_retry_at IS NULL AND state = 'failed')"
)
OLD = "CREATE INDEX CONCURRENTLY IF NOT EXISTS todo_failed_recent_old ON todos_todo (updated_at) WHERE state = 'failed'"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("todos", "0041_fair_key_first"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="todo", name="todo_failed_recent"),
                migrations.AddIndex(
                    model_name="todo",
                    index=models.Index(
                        condition=models.Q(("next_retry_at__isnull", True), ("state", "failed")),
                        fields=["updated_at"],
                        name="todo_failed_recent",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    [
                        NEW,
                        "DROP INDEX CONCURRENTLY IF EXISTS todo_failed_recent",
                        "ALTER INDEX todo_failed_recent_dead RENAME TO todo_failed_recent",
                    ],
                    [
                        OLD,
                        "DROP INDEX CONCURRENTLY IF EXISTS todo_failed_recent",
                        "ALTER INDEX todo_failed_recent_old RENAME TO todo_failed_recent",
                    ],
                ),
            ],
        ),
    ]
