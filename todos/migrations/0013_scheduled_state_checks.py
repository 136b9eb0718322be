"""The scheduled state (issue 12) in the CHECK constraints of 0008 (todos/states.py, SHAPES): the state's
values gain 'scheduled', and a scheduled todo's shape is checked (no owner, no lease, no retry, not
finished, run_at set).

As in 0008 each constraint is added NOT VALID and then validated in its own transaction (a scan under
SHARE UPDATE EXCLUSIVE, claims keep running). The old todo_state_valid is dropped just before its
replacement is added: for that instant the values are unchecked.
"""

from importlib import import_module

from django.db import migrations, models

AddCheckThenValidate = import_module("todos.migrations.0008_state_checks").AddCheckThenValidate


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0012_scheduling_indexes"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="todo",
            name="todo_state_valid",
        ),
        AddCheckThenValidate(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(("state__in", ["pending", "claimed", "done", "failed", "scheduled"])),
                name="todo_state_valid",
            ),
        ),
        AddCheckThenValidate(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state", "scheduled"), _negated=True),
                    models.Q(
                        ("owner__isnull", True),
                        ("run_at__isnull", False),
                        ("lease_expires_at__isnull", True),
                        ("lease_id__isnull", True),
                        ("next_retry_at__isnull", True),
                        ("completed_at__isnull", True),
                    ),
                    _connector="OR",
                ),
                name="todo_scheduled_shape",
            ),
        ),
    ]
