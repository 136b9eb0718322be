"""Indexes behind the admin's filters and the dashboard (see todos/models.py for each one's query).

Built CONCURRENTLY: on a live table of millions of rows a plain CREATE INDEX would block every
claim and completion for as long as the build takes.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("todos", "0003_maintenance_table")]

    operations = [
        AddIndexConcurrently("todo", models.Index(fields=["created_at"], name="todo_admin_recent")),
        AddIndexConcurrently("todo", models.Index(fields=["state", "created_at"], name="todo_admin_state_recent")),
        AddIndexConcurrently("todo", models.Index(fields=["queue", "created_at"], name="todo_admin_queue_recent")),
        AddIndexConcurrently("todo", models.Index(fields=["kind", "created_at"], name="todo_admin_kind_recent")),
        AddIndexConcurrently("todo", models.Index(fields=["source", "created_at"], name="todo_admin_source_recent")),
        AddIndexConcurrently(
            "todo",
            models.Index(
                fields=["assignee", "created_at"],
                condition=models.Q(assignee__isnull=False),
                name="todo_admin_assignee_recent",
            ),
        ),
        AddIndexConcurrently(
            "todo",
            models.Index(fields=["completed_at"], condition=models.Q(state="done"), name="todo_done_recent"),
        ),
        AddIndexConcurrently(
            "todo",
            models.Index(fields=["updated_at"], condition=models.Q(state="failed"), name="todo_failed_recent"),
        ),
    ]
