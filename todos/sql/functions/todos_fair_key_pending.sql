-- Whether a fair key still has pending work, read with a fresh snapshot (VOLATILE): the fair claim's
-- re-check after it locked the key (todos/sql/claim.py).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_key_pending(queue_name text, fair_key text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN EXISTS (SELECT 1 FROM todos_todo t
                   WHERE t.queue = queue_name AND t.fair_key = todos_fair_key_pending.fair_key AND t.state = 'pending');
END
$function$;
