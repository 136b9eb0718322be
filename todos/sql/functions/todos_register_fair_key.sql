-- Register a fair key of a queue at the queue's round (an idle key rejoins at R, banking no turns).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_register_fair_key(queue_name text, fair_key text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM 1 FROM todos_fairkey WHERE queue = queue_name AND key = fair_key FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO todos_fairkey (queue, key, vtime) VALUES (queue_name, fair_key, 0) ON CONFLICT DO NOTHING;
    END IF;
END
$function$;
