"""Indexes for retention (manage.py purge) and the row that lets one reaper of many purge each day.

The indexes are built CONCURRENTLY (so the migration is not atomic): on a live, large todos table a
plain CREATE INDEX would block every claim and completion until it finished.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

# One row per periodic maintenance task; a reaper that moves last_started_at forward (one guarded
# UPSERT) owns that day's run (todos/retention.py: claim_daily_purge).
MAINTENANCE_TABLE = """
CREATE TABLE IF NOT EXISTS todos_maintenance (
    task text PRIMARY KEY,
    last_started_at timestamptz NOT NULL
);
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("todos", "0002_todo_table_tuning")]

    operations = [
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(condition=models.Q(("state", "done")), fields=["completed_at"], name="todo_done_purge"),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("next_retry_at__isnull", True), ("state", "failed")),
                fields=["updated_at"],
                name="todo_dead_purge",
            ),
        ),
        migrations.RunSQL(MAINTENANCE_TABLE, "DROP TABLE IF EXISTS todos_maintenance;"),
    ]
