"""Issue 20: one fan-in. A holder's wait on todos keeps its edges in todos_dependency, as dependencies made at
create do, and todos_settle_dependents settles both; the wait's own columns (awaited_by on the awaited todo,
awaited_left on the waiter) go.

Two mechanisms disagreed: a todo the function cancelled (on_dependency_failure cancel) was never taken off
the awaited_left of a todo waiting for it, which then resolved only at its timeout.

* todos_dependency gains ``wait`` (constant default: no rewrite) and an index on dependent_id of the wait
  edges, for a wait's deletion of the waiter's old edges (partial: a create's edges do not pay for it; a
  batch create of 1,000 items of 3 dependencies took ~30% longer with a full one, loaded machine). The
  table holds open edges only, so a plain build is short; it runs in this migration's transaction.
* The open waits on todos are carried over before the columns go: an edge (wait) for each todo left in a
  waiter's awaited_left, its dependencies_left their count, has_dependents on each. Nothing waits for ever.
* todos_settle_dependents is replaced (CREATE OR REPLACE, the same signature): see FUNCTION.
* Deploy with the web and the reaper stopped, as for any migration that drops a column the old code reads.
"""

from importlib import import_module

from django.db import migrations, models

CARRY_OVER = """
INSERT INTO todos_dependency (dependency_id, dependent_id, position, wait)
SELECT a.id, t.id, a.n - 1, true
FROM todos_todo t CROSS JOIN LATERAL unnest(t.awaited_left) WITH ORDINALITY AS a(id, n)
WHERE t.state = 'waiting' AND cardinality(t.awaited_left) > 0;
UPDATE todos_todo t SET dependencies_left = cardinality(t.awaited_left)
WHERE t.state = 'waiting' AND cardinality(t.awaited_left) > 0;
UPDATE todos_todo t SET has_dependents = true
WHERE NOT t.has_dependents AND t.id IN (SELECT dependency_id FROM todos_dependency WHERE wait);
"""

# The states are written out (a migration does not move with todos/states.py): waiting, pending, scheduled,
# cancelled as there. A resolved wait's history entry and resolution are todos/sql/common.py's _resolved_set
# (by "todos"), and its waitpoint is closed as every resolver closes it (todos/sql/waits.py).
FUNCTION = """
-- Settle the dependents of todos that just finished: ids[i] finished as outcomes[i] ('done', 'dead-letter' or
-- 'cancelled'). Called by every statement that finishes a todo with has_dependents (todos/sql/common.py,
-- _SETTLED), by create for dependencies already finished and by a wait for awaited todos already finished
-- (SETTLE). VOLATILE: each statement takes a fresh snapshot, so it sees the edges and dependents of a create
-- or a wait that committed while the caller waited for the finishing row's lock (the caller's own snapshot,
-- taken before that wait, would not).
-- Per round: the open edges of these todos are deleted (each edge settles once: a dead-letter later
-- completed by its slow worker settles nothing again), then each waiting dependent, locked in id
-- order, counts them off. A dependent made at create: on a failed one with on_dependency_failure = 'cancel'
-- it is cancelled (its errors name the dependency); when none is left it becomes pending (scheduled if its
-- run_at is ahead), resolution {by: dependencies}. A holder's wait on todos (edges marked wait): every
-- outcome counts off; when none is left it becomes pending, resolution {by: todos, todos: the ids it
-- waited for}, history 'wait resolved', and its waitpoint is closed (the timeout sweep finds nothing).
-- Its waitpoint is locked before its todo, in the order of every other resolver and of the timeout
-- sweep (which skips a locked waitpoint): two of them cannot deadlock, and one wins. Moved ones notify
-- their queue. A counted-off dependent that stays waiting changes only dependencies_left, so the update
-- can be HOT (no index column changes). The dependents cancelled here are the next round's todos, so a
-- wait on one of them resolves in the same call.
-- plan_cache_mode: its statement is planned once per connection. Left to choose, the plan cache kept
-- planning it afresh on every call (a custom plan looked cheaper for the one-element arrays of a single
-- complete), which cost more than running it: 5-10 ms a complete on a loaded machine, in bench/claim/fan_in.py.
CREATE OR REPLACE FUNCTION todos_settle_dependents(ids text[], outcomes text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    moved integer := 0;
    n integer;
    cancelled text[];
    resolved text[];
BEGIN
    LOOP
        -- = ANY(ids), not a join with unnest: a probe of the primary key per id, whatever the plan cache
        -- settles on (the join's generic plan hashed a sequential scan of every open edge, per complete).
        WITH edges AS (
            DELETE FROM todos_dependency e
            WHERE e.dependency_id = ANY(ids)
            RETURNING e.dependent_id, e.position, e.dependency_id, e.wait
        ),
        per AS (
            SELECT e.dependent_id, count(*)::integer AS n, bool_or(e.wait) AS wait,
                (array_agg(e.dependency_id ORDER BY e.position) FILTER (WHERE f.outcome <> 'done' AND NOT e.wait))[1]
                    AS failed_id,
                (array_agg(f.outcome ORDER BY e.position) FILTER (WHERE f.outcome <> 'done' AND NOT e.wait))[1]
                    AS failed_as
            FROM edges e JOIN unnest(ids, outcomes) AS f(id, outcome) ON f.id = e.dependency_id
            GROUP BY e.dependent_id
        ),
        -- held, locked and the closing of waitpoints find rows by primary key alone (the state is tested on
        -- the locked row): a partial index's predicate in their WHERE let the plan cache walk the open waitpoints
        -- (waitpoint_timeout) or the waiting todos (todo_waiting) per call whenever its statistics said
        -- those were few. Rarely a dependent no longer waits (a wait that timed out, a cancelled dependent):
        -- its row is locked for nothing, briefly.
        held AS MATERIALIZED (
            SELECT w.todo_id FROM todos_waitpoint w
            WHERE w.todo_id = ANY(ARRAY(SELECT dependent_id FROM per WHERE wait))
            ORDER BY w.todo_id
            FOR NO KEY UPDATE OF w
        ),
        -- The count of held makes the waitpoints' locks come first.
        locked AS MATERIALIZED (
            SELECT t.id, t.state, t.dependencies_left FROM todos_todo t
            WHERE t.id = ANY(ARRAY(SELECT dependent_id FROM per)) AND (SELECT count(*) FROM held) >= 0
            ORDER BY t.id
            FOR NO KEY UPDATE OF t
        ),
        -- The decision reads t in SET, which is the row's latest version (the lock above may have waited for
        -- another settling); the CTEs' own snapshot may be older. failed_id is NULL for a wait's edges.
        changed AS (
            UPDATE todos_todo t SET
                dependencies_left = GREATEST(t.dependencies_left - per.n, 0),
                state = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel' THEN 'cancelled'
                             WHEN t.dependencies_left > per.n THEN 'waiting'
                             WHEN t.run_at > now() AND t.owner IS NULL THEN 'scheduled'
                             ELSE 'pending' END,
                waiting_for = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel' THEN NULL
                                   WHEN t.dependencies_left > per.n THEN t.waiting_for END,
                resolution = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel' THEN t.resolution
                                  WHEN t.dependencies_left > per.n THEN t.resolution
                                  WHEN per.wait THEN jsonb_build_object('by', 'todos', 'at', now(),
                                      'todos', t.waiting_for -> 'todos')
                                  ELSE jsonb_build_object('by', 'dependencies', 'at', now()) END,
                completed_at = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel'
                                    THEN now() ELSE t.completed_at END,
                errors = CASE WHEN per.failed_id IS NOT NULL AND t.on_dependency_failure = 'cancel'
                    THEN t.errors || jsonb_build_array(jsonb_build_object(
                        'attempt', t.attempt, 'at', now(), 'error', 'dependency ' || per.failed_as,
                        'dependency', per.failed_id, 'was', 'waiting'))
                    WHEN per.wait AND t.dependencies_left <= per.n
                    THEN t.errors || jsonb_build_array(jsonb_build_object(
                        'attempt', t.attempt, 'at', now(), 'error', 'wait resolved', 'by', 'todos'))
                    ELSE t.errors END,
                updated_at = CASE WHEN (per.failed_id IS NULL OR t.on_dependency_failure <> 'cancel')
                                   AND t.dependencies_left > per.n THEN t.updated_at ELSE now() END
            FROM per
            WHERE t.id = per.dependent_id
              AND t.id = ANY(ARRAY(SELECT id FROM locked WHERE state = 'waiting' AND dependencies_left > 0))
            RETURNING t.id, t.queue, t.state, t.run_at, t.has_dependents, per.wait
        ),
        notified AS MATERIALIZED (
            SELECT pg_notify('switchboard_todos', CASE WHEN q.n > 1 THEN q.queue || ' ' || q.n ELSE q.queue END)
            FROM (SELECT queue, count(*) AS n FROM changed
                  WHERE state = 'pending' OR (state = 'scheduled' AND run_at <= now() + interval '20 seconds')
                  GROUP BY queue) q
        )
        SELECT count(*) FILTER (WHERE state <> 'waiting'),
            array_agg(id) FILTER (WHERE state = 'cancelled' AND has_dependents),
            array_agg(id) FILTER (WHERE wait AND state <> 'waiting')
        INTO n, cancelled, resolved
        FROM changed CROSS JOIN (SELECT count(*) FROM notified) x;
        -- The waits resolved close their waitpoints (locked above), in a statement of their own: a child
        -- that only counts one off, almost every one, does not start an UPDATE of the waitpoints.
        IF resolved IS NOT NULL THEN
            UPDATE todos_waitpoint SET resolved_at = now() WHERE todo_id = ANY(resolved);
        END IF;
        moved := moved + n;
        EXIT WHEN cancelled IS NULL;
        ids := cancelled;
        outcomes := array_fill('cancelled'::text, ARRAY[cardinality(ids)]);
    END LOOP;
    RETURN moved;
END
$$;
"""

FUNCTION_BACKWARD = import_module("todos.migrations.0017_dependencies").FUNCTIONS.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0017_dependencies"),
    ]

    operations = [
        migrations.AddField(
            model_name="dependency",
            name="wait",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AddIndex(
            model_name="dependency",
            index=models.Index(fields=["dependent_id"], condition=models.Q(wait=True), name="dependency_waiter"),
        ),
        # Backward: the edges of waits go (the old columns, re-added empty, cannot take them back).
        migrations.RunSQL(CARRY_OVER, "DELETE FROM todos_dependency WHERE wait"),
        migrations.RunSQL(FUNCTION, FUNCTION_BACKWARD),
        migrations.RemoveField(model_name="todo", name="awaited_by"),
        migrations.RemoveField(model_name="todo", name="awaited_left"),
    ]
