-- A fair key's token bucket now (issue 31, a fair queue's rate_per_key), read with a fresh snapshot (VOLATILE)
-- from the key's row, which the caller has locked: its rate is rate_per_key times the key's weight, its burst
-- that rate's whole second (at least 1); a key with no bucket yet (tokens NULL) starts full. NULL when the
-- queue has no rate_per_key. The claim writes the bucket back (todos/sql/claim.py, fair_state).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_key_tokens(queue_name text, fair_key text, rate double precision)
 RETURNS double precision
 LANGUAGE plpgsql
AS $function$
DECLARE
    burst double precision := GREATEST(1, ceil(rate));
    have double precision;
    since timestamptz;
BEGIN
    IF rate IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT k.tokens, k.refilled_at INTO have, since FROM todos_fairkey k
    WHERE k.queue = queue_name AND k.key = fair_key;
    IF have IS NULL THEN
        RETURN burst;
    END IF;
    RETURN LEAST(burst, have + GREATEST(EXTRACT(EPOCH FROM now() - since)::double precision, 0) * rate);
END
$function$;
