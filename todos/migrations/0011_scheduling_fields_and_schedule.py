"""Scheduling (issue 12): run_at and priority on every todo, the scheduled state, and recurring schedules.

run_at is added with the database's now() as its default (a stable default: PostgreSQL stores it once,
no table rewrite) and then set to each existing todo's created_at, which is what it means for a todo that
was never scheduled. That UPDATE does rewrite every row: on a large table run it at a quiet time. The
indexes that use the new columns are built concurrently by 0012.
"""

import django.core.validators
import django.db.models.functions.datetime
from django.db import migrations, models

import todos.models


class Migration(migrations.Migration):
    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0010_todo_title_trgm"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="priority",
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="todo",
            name="run_at",
            field=models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
        ),
        migrations.RunSQL("UPDATE todos_todo SET run_at = created_at", migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="todo",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "pending"),
                    ("claimed", "claimed"),
                    ("done", "done"),
                    ("failed", "failed"),
                    ("scheduled", "scheduled"),
                ],
                default="pending",
                max_length=10,
            ),
        ),
        migrations.AddConstraint(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", -100), ("priority__lte", 100)), name="todo_priority_range"
            ),
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "name",
                    models.CharField(max_length=100, unique=True, validators=[todos.models.validate_schedule_name]),
                ),
                (
                    "cron",
                    models.CharField(
                        help_text="5 fields, e.g. 30 2 * * *", max_length=200, validators=[todos.models.validate_cron]
                    ),
                ),
                (
                    "timezone",
                    models.CharField(default="UTC", max_length=64, validators=[todos.models.validate_timezone]),
                ),
                ("queue", models.CharField(max_length=200, validators=[todos.models.validate_queue_name])),
                ("kind", models.CharField(blank=True, default="", max_length=100)),
                ("title", models.CharField(blank=True, default="", max_length=500)),
                ("payload", models.JSONField(blank=True, default=dict)),
                (
                    "priority",
                    models.SmallIntegerField(
                        default=0,
                        validators=[
                            django.core.validators.MinValueValidator(-100),
                            django.core.validators.MaxValueValidator(100),
                        ],
                    ),
                ),
                (
                    "max_attempts",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Empty: the queue's default.",
                        null=True,
                        validators=[django.core.validators.MinValueValidator(1)],
                    ),
                ),
                ("is_active", models.BooleanField(default=True)),
                (
                    "catch_up",
                    models.CharField(
                        choices=[("latest", "latest"), ("none", "none"), ("all", "all")],
                        default="latest",
                        max_length=10,
                    ),
                ),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("last_tick_at", models.DateTimeField(blank=True, null=True)),
                ("next_tick_at", models.DateTimeField(blank=True, null=True)),
                ("last_todo_id", models.CharField(blank=True, max_length=40, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", -100), ("priority__lte", 100)), name="schedule_priority_range"
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("catch_up__in", ["latest", "none", "all"])), name="schedule_catch_up_valid"
            ),
        ),
    ]
