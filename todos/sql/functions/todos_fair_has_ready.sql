-- Whether a fair queue has reserved todos (todos_fairready), read with a fresh snapshot (VOLATILE): a contended fair
-- turn asks after it waited for the queue's row (todos/sql/claim.py, ``yielded``). The claimer it waited for may have
-- just reserved; then this turn reserves nothing more and claims nothing, and its caller takes a reserved todo
-- (CLAIM_FAIR_READY): claimers queued behind one reserver do not each reserve FAIR_RESERVE more. One probe of
-- fair_ready_claim.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_has_ready(queue_name text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN EXISTS (SELECT 1 FROM todos_fairready r WHERE r.queue = queue_name);
END
$function$;
