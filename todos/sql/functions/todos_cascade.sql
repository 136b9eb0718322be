-- Cascading cancel (issue 30): cancels up to `bound` unfinished descendants of the todos `ids` (walked down
-- parent_id through index todo_children), each recording why ('ancestor <id> <why>', by `by_whom`), in the
-- queues matching `visible` (the canceller's scopes; '%' for an operator or a children: cancel policy).
-- Called by queue.cancel(cascade=True) in the cancel's transaction, by the trigger of a todo finishing with
-- children: cancel, and by reap_once for a cascade left over. When it took a whole bound (more may be left)
-- it marks `ids` with cascade {by, reason, visible}, which reap_once resumes; when it took less, it clears
-- the mark. A cancelled claimed todo keeps its receipt as revoked_lease_id, so its holder's late complete is
-- kept as a tombstone (sql.LATE_RESULT). Settles dependents of what it cancels and notifies their queues.
-- Lock order: descendants in walk order, after their ancestor: queue.cancel runs it after cancelling the
-- ancestor, the trigger of children: cancel after its finish (a tree's lock order, ancestors first: a child's
-- usage report or a fan-in's complete locks the root and parent before the child, todos/sql/trees.py).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_cascade(ids text[], by_whom text, why text, visible text[], bound integer)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    n integer;
BEGIN
    WITH RECURSIVE below(id, ancestor, open) AS (
        SELECT c.id, c.parent_id, (c.state IN ('pending', 'claimed', 'scheduled', 'waiting')
                OR (c.state = 'failed' AND c.next_retry_at IS NOT NULL)) AND c.queue LIKE ANY(visible)
        FROM todos_todo c WHERE c.parent_id = ANY(ids)
        UNION ALL
        SELECT c.id, b.ancestor, (c.state IN ('pending', 'claimed', 'scheduled', 'waiting')
                OR (c.state = 'failed' AND c.next_retry_at IS NOT NULL)) AND c.queue LIKE ANY(visible)
        FROM below b JOIN todos_todo c ON c.parent_id = b.id
    ),
    picked AS MATERIALIZED (
        SELECT id, ancestor FROM below WHERE open LIMIT bound
    ),
    changed AS (
        UPDATE todos_todo t SET
            state = 'cancelled',
            errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
                'attempt', t.attempt, 'at', now(), 'error', 'cancelled', 'cancelled_by', by_whom,
                'reason', 'ancestor ' || p.ancestor || ' ' || why, 'was', t.state, 'owner', t.owner)),
                '$[last - 99 to last]'),
            completed_at = now(),
            revoked_lease_id = t.lease_id,
            lease_id = NULL,
            lease_expires_at = NULL,
            next_retry_at = NULL,
            updated_at = now()
        FROM picked p
        WHERE t.id = p.id AND (t.state IN ('pending', 'claimed', 'scheduled', 'waiting')
            OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
        RETURNING t.id, t.queue, t.has_dependents
    ),
    settled AS MATERIALIZED (
        SELECT todos_settle_dependents(array_agg(id), array_agg('cancelled'::text)) FROM changed
        WHERE has_dependents HAVING count(*) > 0
    ),
    notified AS MATERIALIZED (
        SELECT pg_notify('switchboard_todos', CASE WHEN q.n > 1 THEN q.queue || ' ' || q.n ELSE q.queue END)
        FROM (SELECT queue, count(*) AS n FROM changed GROUP BY queue) q
    )
    SELECT count(*) INTO n FROM changed CROSS JOIN (SELECT count(*) FROM settled) s
        CROSS JOIN (SELECT count(*) FROM notified) x;
    IF n >= bound THEN
        UPDATE todos_todo SET cascade = jsonb_build_object('by', by_whom, 'reason', why, 'visible', to_jsonb(visible))
        WHERE id = ANY(ids) AND cascade IS NULL;
    ELSE
        UPDATE todos_todo SET cascade = NULL WHERE id = ANY(ids) AND cascade IS NOT NULL;
    END IF;
    RETURN n;
END
$function$;
