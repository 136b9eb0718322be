-- The first pending todo of one fair key this agent may claim, (priority, run_at), read with a fresh snapshot
-- (VOLATILE): where the fair claim's scan of that key's todos starts (todos/sql/claim.py, fair_pending; migration
-- 0040). The claim's own snapshot is older than the queue row's lock it waited for, so it still shows the todos
-- its predecessors took as pending: scanning from the key's head, it stepped over each of them and re-checked
-- its latest version under the lock (2 keys of 10,000 todos, 16 claimers: ~15 re-checks a claim). No pending todo
-- of the key comes before this one now. One descent of todo_fair_pending.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_key_first(queue_name text, fair_key text, agent text)
 RETURNS TABLE(priority smallint, run_at timestamp with time zone)
 LANGUAGE plpgsql
 ROWS 1
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT t.priority, t.run_at FROM todos_todo t
        WHERE t.state = 'pending' AND t.queue = queue_name AND t.fair_key = todos_fair_key_first.fair_key
          AND (t.assignee IS NULL OR t.assignee = agent)
          -- not reserved (todos_fairready, issue 31): already charged to the key; CLAIM_FAIR_READY's to hand out
          AND NOT EXISTS (SELECT 1 FROM todos_fairready r WHERE r.id = t.id)
        ORDER BY t.priority, t.run_at
        LIMIT 1;
END
$function$;
