"""Fewer index writes per transition.

Every claim, heartbeat and completion is a non-HOT update (state appears in partial-index
predicates), so each full index on todos_todo takes a new entry on every transition. This drops two
admin indexes whose queries other indexes serve (the state filter: the partial state indexes; the
queue filter: a backwards walk of todo_admin_recent), and replaces the event FK's full index with a
partial one, since most todos have no event. All CONCURRENTLY: a live queue is never blocked.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

FK_INDEX = "todos_todo_event_id_780be6bb"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0005_drop_redundant_like_indexes"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="todo", name="todo_admin_state_recent"),
        RemoveIndexConcurrently(model_name="todo", name="todo_admin_queue_recent"),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(condition=models.Q(("event__isnull", False)), fields=["event"], name="todo_event"),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="todo",
                    name="event",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="todos",
                        to="events.event",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX CONCURRENTLY IF EXISTS {FK_INDEX}",
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {FK_INDEX} ON todos_todo (event_id)",
                ),
            ],
        ),
    ]
