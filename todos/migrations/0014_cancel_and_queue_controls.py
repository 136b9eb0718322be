"""Issue 11 (control): the cancelled state, queue controls, and what the claim needs to enforce them.

* ``cancelled``: the state's CHECK lists it (beside 0013's ``scheduled``), and its shape has its own CHECK (todos/states.py, SHAPES);
  both added NOT VALID then validated, as in 0008, so a large table keeps working while it is checked.
* todos_queue gains paused, max_claimed, rate_per_second, rate_burst and the token bucket's state.
  Nullable or with a database default: no table rewrite.
* todo_live_leases (queue, lease_expires_at) WHERE claimed: a limited queue's live leases, counted by
  every claim of it; todo_cancelled_recent: retention and the dashboard. CONCURRENTLY, as in 0006.
* todos_live_leases(queue): that count with a fresh snapshot (see FUNCTIONS).
* The registering trigger (0009) reads before it inserts (see FUNCTIONS; 0009 does too since main's
  change to it, so this restates it beside the reason a limited queue needs it).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

FUNCTIONS = """
-- The claim statement (todos/sql.py, CLAIM_NEXT) locks a limited queue's row and then asks this for the
-- queue's live leases. A VOLATILE function's statements each take a fresh snapshot (READ COMMITTED), so
-- the count includes the leases of claims that committed while this claim waited for the row lock; a
-- subquery of the claim statement itself would count from the snapshot taken before the wait and let
-- every waiting claimer through. Served by todo_live_leases. The condition is states.LIVE_LEASE.
CREATE FUNCTION todos_live_leases(queue_name text) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*) FROM todos_todo t
            WHERE t.queue = queue_name AND t.state = 'claimed' AND t.lease_expires_at >= now());
END
$$;

-- The queue registry's trigger, reading first: an INSERT ... ON CONFLICT alone waits for any transaction
-- that is updating the queue's row, and a rate-limited queue's row is updated by its claims (the token
-- bucket). A plain read never waits, and a queue is registered once and read ever after.
CREATE OR REPLACE FUNCTION todos_register_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM todos_queue WHERE name = NEW.queue) THEN
        INSERT INTO todos_queue (name, created_at) VALUES (NEW.queue, now()) ON CONFLICT (name) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;
"""

# 0009 itself now reads first (main took the same change, for speed), so going back leaves the trigger
# as 0009 made it: only the new function goes.
FUNCTIONS_BACKWARD = """
DROP FUNCTION todos_live_leases(text);
CREATE OR REPLACE FUNCTION todos_register_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM todos_queue WHERE name = NEW.queue) THEN
        INSERT INTO todos_queue (name, created_at) VALUES (NEW.queue, now()) ON CONFLICT (name) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;
"""


class AddCheckThenValidate(migrations.AddConstraint):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table = schema_editor.quote_name(model._meta.db_table)
        name = schema_editor.quote_name(self.constraint.name)
        check = self.constraint._get_check_sql(model, schema_editor)
        schema_editor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({check}) NOT VALID")
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0013_scheduled_state_checks"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="can_manage_queues",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="paused",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="max_claimed",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_per_second",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_burst",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="tokens",
            field=models.FloatField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="refilled_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("rate_per_second__isnull", True),
                    models.Q(
                        ("rate_burst__gte", 1),
                        ("rate_per_second__gt", 0),
                        ("refilled_at__isnull", False),
                        ("tokens__isnull", False),
                    ),
                    _connector="OR",
                ),
                name="queue_rate_limit_shape",
            ),
        ),
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
                    ("cancelled", "cancelled"),
                ],
                default="pending",
                max_length=10,
            ),
        ),
        migrations.RemoveConstraint(model_name="todo", name="todo_state_valid"),
        AddCheckThenValidate(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(("state__in", ["pending", "claimed", "done", "failed", "scheduled", "cancelled"])),
                name="todo_state_valid",
            ),
        ),
        AddCheckThenValidate(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state", "cancelled"), _negated=True),
                    models.Q(
                        ("completed_at__isnull", False),
                        ("lease_expires_at__isnull", True),
                        ("lease_id__isnull", True),
                        ("next_retry_at__isnull", True),
                    ),
                    _connector="OR",
                ),
                name="todo_cancelled_shape",
            ),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("state", "claimed")),
                fields=["queue", "lease_expires_at"],
                name="todo_live_leases",
            ),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("state", "cancelled")),
                fields=["completed_at"],
                include=["queue"],
                name="todo_cancelled_recent",
            ),
        ),
        migrations.RunSQL(FUNCTIONS, FUNCTIONS_BACKWARD),
    ]
