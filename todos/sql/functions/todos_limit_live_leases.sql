-- Live leases held by one named limit (issue 31): claimed, unexpired todos that name it or whose queue names
-- it; with fair_key, only that key's (a limit's per_key). A fresh snapshot per call (VOLATILE), as
-- todos_live_leases: the claim counts after taking the limit's row (todos/sql/flow.py). Reads the partial GIN
-- index todo_limit_leases (claimed todos naming limits) and todo_live_leases for the queues naming it.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_limit_live_leases(limit_name text, key text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN (SELECT count(*) FROM todos_todo t
            WHERE t.state = 'claimed' AND t.lease_expires_at >= now()
              AND (key IS NULL OR t.fair_key = key)
              AND ((t.limits @> ARRAY[limit_name] AND t.limits IS NOT NULL)
                   OR t.queue IN (SELECT q.name FROM todos_queue q WHERE q.limits @> ARRAY[limit_name])));
END
$function$;
