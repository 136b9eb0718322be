"""Issue 20: dependencies at create.

* todos_todo gains depends_on (nullable), dependencies_left, on_dependency_failure and has_dependents (each
  with a constant database default), none with a CHECK: no rewrite and no scan of a large table.
* todos_dependency: the open waits, dependency -> (dependent, position), keyed by dependency first: the one
  index a finishing todo probes.
* todos_settle_dependents(ids, outcomes): see FUNCTIONS, and todos/sql.py ("Dependencies").
"""

import django.contrib.postgres.fields
from django.db import migrations, models

# The states are written out (a migration does not move with todos/states.py): waiting, pending, scheduled,
# cancelled as there; the shape of waiting (waiting_for set) is migration 0015's.
FUNCTIONS = """
-- Settle the dependents of todos that just finished: ids[i] finished as outcomes[i] ('done', 'dead-letter' or
-- 'cancelled'). Called by every statement that finishes a todo with has_dependents (todos/sql.py, _SETTLED)
-- and by create for dependencies already finished (SETTLE). VOLATILE: each statement takes a fresh snapshot,
-- so it sees the edges and dependents of a create that committed while the caller waited for the finishing
-- row's lock (the caller's own snapshot, taken before that wait, would not).
-- Per round: the open edges of these todos are deleted (each edge settles once: a dead-letter later
-- completed by its slow worker settles nothing again), then each waiting dependent, locked in id
-- order, counts them off: on a failed one with on_dependency_failure = 'cancel' it is cancelled (its errors
-- name the dependency); when none is left it becomes pending (scheduled if its run_at is ahead), and its
-- queue is notified. A counted-off dependent that stays waiting changes only dependencies_left, so the
-- update can be HOT (no index column changes). The dependents cancelled here are the next round's todos.
-- plan_cache_mode: its statement is planned once per connection. Left to choose, the plan cache kept
-- planning it afresh on every call (a custom plan looked cheaper for the one-element arrays of a single
-- complete), which cost more than running it: 5-10 ms a complete on a loaded machine, in bench/claim/fan_in.py.
CREATE FUNCTION todos_settle_dependents(ids text[], outcomes text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    moved integer := 0;
    n integer;
    cancelled text[];
BEGIN
    LOOP
        WITH edges AS (
            DELETE FROM todos_dependency e
            USING unnest(ids, outcomes) AS f(id, outcome)
            WHERE e.dependency_id = f.id
            RETURNING e.dependent_id, e.position, e.dependency_id, f.outcome
        ),
        per AS (
            SELECT dependent_id, count(*)::integer AS n,
                (array_agg(dependency_id ORDER BY position) FILTER (WHERE outcome <> 'done'))[1] AS failed_id,
                (array_agg(outcome ORDER BY position) FILTER (WHERE outcome <> 'done'))[1] AS failed_as
            FROM edges GROUP BY dependent_id
        ),
        locked AS MATERIALIZED (
            -- = ANY(ARRAY(...)): by the primary key, whatever the plan cache settles on (a join here once
            -- walked the small todo_waiting index, every waiting todo, per settle).
            SELECT t.id FROM todos_todo t
            WHERE t.id = ANY(ARRAY(SELECT dependent_id FROM per)) AND t.state = 'waiting' AND t.dependencies_left > 0
            ORDER BY t.id
            FOR NO KEY UPDATE OF t
        ),
        -- The decision reads t in SET, which is the row's latest version (the lock above may have waited for
        -- another settling); the CTEs' own snapshot may be older.
        changed AS (
            UPDATE todos_todo t SET
                dependencies_left = GREATEST(t.dependencies_left - per.n, 0),
                state = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel' THEN 'cancelled'
                             WHEN t.dependencies_left > per.n THEN 'waiting'
                             WHEN t.run_at > now() THEN 'scheduled'
                             ELSE 'pending' END,
                waiting_for = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel' THEN NULL
                                   WHEN t.dependencies_left > per.n THEN t.waiting_for END,
                resolution = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel' THEN t.resolution
                                  WHEN t.dependencies_left > per.n THEN t.resolution
                                  ELSE jsonb_build_object('by', 'dependencies', 'at', now()) END,
                completed_at = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel'
                                    THEN now() ELSE t.completed_at END,
                errors = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel'
                    THEN t.errors || jsonb_build_array(jsonb_build_object(
                        'attempt', t.attempt, 'at', now(), 'error', 'dependency ' || per.failed_as,
                        'dependency', per.failed_id, 'was', 'waiting'))
                    ELSE t.errors END,
                updated_at = CASE WHEN (per.failed_id IS NULL OR t.on_dependency_failure <> 'cancel')
                                   AND t.dependencies_left > per.n THEN t.updated_at ELSE now() END
            FROM per
            WHERE t.id = per.dependent_id AND t.id = ANY(ARRAY(SELECT id FROM locked))
              AND t.state = 'waiting' AND t.dependencies_left > 0
            RETURNING t.id, t.queue, t.state, t.run_at, t.has_dependents
        ),
        notified AS MATERIALIZED (
            SELECT pg_notify('switchboard_todos', CASE WHEN q.n > 1 THEN q.queue || ' ' || q.n ELSE q.queue END)
            FROM (SELECT queue, count(*) AS n FROM changed
                  WHERE state = 'pending' OR (state = 'scheduled' AND run_at <= now() + interval '20 seconds')
                  GROUP BY queue) q
        )
        SELECT count(*) FILTER (WHERE state <> 'waiting'),
            array_agg(id) FILTER (WHERE state = 'cancelled' AND has_dependents)
        INTO n, cancelled
        FROM changed CROSS JOIN (SELECT count(*) FROM notified) x;
        moved := moved + n;
        EXIT WHEN cancelled IS NULL;
        ids := cancelled;
        outcomes := array_fill('cancelled'::text, ARRAY[cardinality(ids)]);
    END LOOP;
    RETURN moved;
END
$$;
"""

FUNCTIONS_BACKWARD = "DROP FUNCTION todos_settle_dependents(text[], text[]);"


class Migration(migrations.Migration):
    dependencies = [
        # The chain is linear: 0015, 0019, 0018, 0016, then this.
        ("todos", "0016_fair_share"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="depends_on",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=40), blank=True, editable=False, null=True, size=None
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="dependencies_left",
            field=models.IntegerField(db_default=0, editable=False),
        ),
        migrations.AddField(
            model_name="todo",
            name="has_dependents",
            field=models.BooleanField(db_default=False, editable=False),
        ),
        migrations.AddField(
            model_name="todo",
            name="on_dependency_failure",
            field=models.CharField(choices=[("cancel", "cancel"), ("run", "run")], db_default="cancel", max_length=6),
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "dependency_id",
                        "dependent_id",
                        "position",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("dependency_id", models.CharField(max_length=40)),
                ("dependent_id", models.CharField(max_length=40)),
                ("position", models.PositiveIntegerField()),
            ],
        ),
        migrations.RunSQL(FUNCTIONS, FUNCTIONS_BACKWARD),
    ]
