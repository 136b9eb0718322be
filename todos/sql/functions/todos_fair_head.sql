-- The most urgent pending todo of one fair queue this agent may claim, (priority, fair_key), read with a
-- fresh snapshot (VOLATILE): the fair claim calls it after taking the queue's row (issue 31), so it sees what
-- the claimer before it took; the statement's own snapshot may still show that claimer's todos as pending
-- (todos/sql/claim.py, fair_queues). One descent of todo_pending_claim_scan.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_head(queue_name text, agent text)
 RETURNS TABLE(priority smallint, fair_key text)
 LANGUAGE plpgsql
 ROWS 1
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT t.priority, t.fair_key::text FROM todos_todo t
        WHERE t.state = 'pending' AND t.queue = queue_name AND (t.assignee IS NULL OR t.assignee = agent)
          -- since issue 31: not expired, nor held by a parked limit of its own (as the walk)
          AND (t.expires_at IS NULL OR t.expires_at > now() OR t.claimed_at IS NOT NULL)
          AND (t.limits IS NULL OR NOT EXISTS (
              SELECT 1 FROM todos_limit l
              WHERE l.name = ANY(t.limits) AND l.parked_until IS NOT NULL AND l.parked_until > now()))
          -- nor reserved (todos_fairready, issue 31): CLAIM_FAIR_READY's to hand out
          AND NOT EXISTS (SELECT 1 FROM todos_fairready r WHERE r.id = t.id)
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT 1;
END
$function$;
