-- Trigger: a todo that becomes pending on a fair or per-key-capped queue registers its fair key.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_pending_fair_key()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM todos_queue WHERE name = NEW.queue AND (fair OR max_claimed_per_key IS NOT NULL)) THEN
        PERFORM todos_register_fair_key(NEW.queue, NEW.fair_key);
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE TRIGGER todo_pending_registers_fair_key AFTER UPDATE OF state ON todos_todo FOR EACH ROW WHEN ((((new.state)::text = 'pending'::text) AND ((old.state)::text <> 'pending'::text))) EXECUTE FUNCTION todos_pending_fair_key();
