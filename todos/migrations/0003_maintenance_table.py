"""The row that lets one reaper of many purge each day (todos/retention.py: claim_daily_purge).

Retention's range scans use the dashboard's partial indexes from 0004 (todo_done_recent on
completed_at for done todos, todo_failed_recent on updated_at for failed ones).
"""

from django.db import migrations

# One row per periodic maintenance task; a reaper that moves last_started_at forward (one guarded
# UPSERT) owns that day's run.
MAINTENANCE_TABLE = """
CREATE TABLE IF NOT EXISTS todos_maintenance (
    task text PRIMARY KEY,
    last_started_at timestamptz NOT NULL
);
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0002_todo_table_tuning")]

    operations = [
        migrations.RunSQL(MAINTENANCE_TABLE, "DROP TABLE IF EXISTS todos_maintenance;"),
    ]
