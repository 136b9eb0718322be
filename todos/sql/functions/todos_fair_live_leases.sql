-- Live leases of one fair key: max_claimed_per_key's count, a fresh snapshot per call (todos/sql/claim.py).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_live_leases(queue_name text, fair_key text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN (SELECT count(*) FROM todos_todo t
            WHERE t.queue = queue_name AND t.state = 'claimed' AND t.lease_expires_at >= now()
              AND t.fair_key = todos_fair_live_leases.fair_key);
END
$function$;
