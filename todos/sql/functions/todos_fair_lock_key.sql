-- Lock one fair key's row (SKIP LOCKED unless wait) and return its pass, if it is under its cap: the
-- fair claim's lapsed, due and scheduled candidates (todos/sql/claim.py).
-- ROWS 1 (migration 0039): one key's row or none; the default estimate of 1,000 multiplied the claim's cost.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_lock_key(queue_name text, fair_key text, cap integer, wait boolean)
 RETURNS TABLE(key text, vtime double precision)
 LANGUAGE plpgsql
 ROWS 1
AS $function$
#variable_conflict use_column
DECLARE
    pass double precision;
BEGIN
    -- A plain read first: an insert attempt on a row another claimer is updating would wait for it.
    PERFORM 1 FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = fair_key;
    IF NOT FOUND THEN
        INSERT INTO todos_fairkey AS k (queue, key, vtime) VALUES (queue_name, fair_key, 0) ON CONFLICT DO NOTHING;
    END IF;
    IF wait THEN
        SELECT k.vtime INTO pass FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = fair_key
        FOR NO KEY UPDATE;
    ELSE
        SELECT k.vtime INTO pass FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = fair_key
        FOR NO KEY UPDATE SKIP LOCKED;
    END IF;
    IF FOUND AND (cap IS NULL OR todos_fair_live_leases(queue_name, fair_key) < cap) THEN
        RETURN QUERY SELECT fair_key, pass;
    END IF;
END
$function$;
