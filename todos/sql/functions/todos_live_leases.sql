-- Live leases of one queue, read with a fresh snapshot: max_claimed's count (todos/sql/claim.py).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_live_leases(queue_name text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN (SELECT count(*) FROM todos_todo t
            WHERE t.queue = queue_name AND t.state = 'claimed' AND t.lease_expires_at >= now());
END
$function$;
