-- The one fan-in (0020): called by every statement that finishes a todo with has_dependents, it
-- counts off the open edges of its dependents and wakes, resolves or cancels each as its edge's rule says.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_settle_dependents(ids text[], outcomes text[])
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
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
$function$;
