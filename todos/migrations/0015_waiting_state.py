"""Issue 20: the waiting state, and the open waits that resolve it.

* ``waiting`` joins the state's CHECK, and its shape has its own (todos/states.py, SHAPES: waiting_for set,
  no lease, no retry, not finished); both added NOT VALID then validated, as in 0008/0013/0014.
* todo_runnable_idempotency_key covers waiting todos (they hold their key), built CONCURRENTLY under a new
  name and swapped in, as in 0012, so creates keep their arbiter throughout.
* todos_todo gains waiting_for, resolution, and a wait on todos' edges (awaited_by, on the awaited todo) and
  what is left (awaited_left, on the waiter); all nullable: no rewrite; todo_waiting (queue) WHERE waiting,
  CONCURRENTLY, for queue_stats() and the admin's filter.
* todos_waitpoint: each todo's latest wait, with a partial index of the open ones per resolver (timeout,
  event key).
"""

from importlib import import_module

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
import django.db.models.functions.datetime
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

AddCheckThenValidate = import_module("todos.migrations.0008_state_checks").AddCheckThenValidate
swap = import_module("todos.migrations.0012_scheduling_indexes").swap

KEY_NEW = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS todo_runnable_idempotency_key_w "
    "ON todos_todo (queue, idempotency_key) WHERE idempotency_key IS NOT NULL "
    "AND (state IN ('pending', 'claimed', 'scheduled', 'waiting') OR (state = 'failed' AND next_retry_at IS NOT NULL))"
)
KEY_OLD = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS todo_runnable_idempotency_key_s "
    "ON todos_todo (queue, idempotency_key) WHERE idempotency_key IS NOT NULL "
    "AND (state IN ('pending', 'claimed', 'scheduled') OR (state = 'failed' AND next_retry_at IS NOT NULL))"
)
STATES = ["pending", "claimed", "done", "failed", "scheduled", "cancelled", "waiting"]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0014_cancel_and_queue_controls"),
    ]

    operations = [
        migrations.CreateModel(
            name="Waitpoint",
            fields=[
                ("todo_id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=200)),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("timeout_at", models.DateTimeField()),
                (
                    "on_timeout",
                    models.CharField(
                        choices=[("pending", "pending"), ("fail", "fail")], default="pending", max_length=10
                    ),
                ),
                ("token_hash", models.CharField(blank=True, max_length=64, null=True, unique=True)),
                ("event_source", models.CharField(blank=True, max_length=100, null=True)),
                ("event_type_like", models.CharField(blank=True, max_length=300, null=True)),
                ("event_match", models.JSONField(blank=True, null=True)),
                ("event_key", models.CharField(blank=True, max_length=32, null=True)),
                ("resolved_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("resolved_at__isnull", True)),
                        fields=["timeout_at"],
                        name="waitpoint_timeout",
                    ),
                    models.Index(
                        condition=models.Q(("event_key__isnull", False), ("resolved_at__isnull", True)),
                        fields=["event_key"],
                        name="waitpoint_event_key",
                    ),
                ],
            },
        ),
        migrations.AddField(model_name="todo", name="resolution", field=models.JSONField(blank=True, null=True)),
        migrations.AddField(
            model_name="todo",
            name="awaited_by",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=40), blank=True, null=True, size=None
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="awaited_left",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=40), blank=True, null=True, size=None
            ),
        ),
        migrations.AddField(model_name="todo", name="waiting_for", field=models.JSONField(blank=True, null=True)),
        migrations.AlterField(
            model_name="todo",
            name="state",
            field=models.CharField(choices=[(s, s) for s in STATES], default="pending", max_length=10),
        ),
        migrations.RemoveConstraint(model_name="todo", name="todo_state_valid"),
        AddCheckThenValidate(
            model_name="todo",
            constraint=models.CheckConstraint(condition=models.Q(("state__in", STATES)), name="todo_state_valid"),
        ),
        AddCheckThenValidate(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state", "waiting"), _negated=True),
                    models.Q(
                        ("waiting_for__isnull", False),
                        ("lease_expires_at__isnull", True),
                        ("lease_id__isnull", True),
                        ("next_retry_at__isnull", True),
                        ("completed_at__isnull", True),
                    ),
                    _connector="OR",
                ),
                name="todo_waiting_shape",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="todo", name="todo_runnable_idempotency_key"),
                migrations.AddConstraint(
                    model_name="todo",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("idempotency_key__isnull", False),
                            models.Q(
                                ("state__in", ["pending", "claimed", "scheduled", "waiting"]),
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
                    swap(KEY_NEW, "todo_runnable_idempotency_key", "todo_runnable_idempotency_key_w"),
                    swap(KEY_OLD, "todo_runnable_idempotency_key", "todo_runnable_idempotency_key_s"),
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(condition=models.Q(("state", "waiting")), fields=["queue"], name="todo_waiting"),
        ),
    ]
