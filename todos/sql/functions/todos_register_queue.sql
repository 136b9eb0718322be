-- Trigger, per row on UPDATE OF queue: register a moved todo's queue (and fair key) in todos_queue.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_register_queue()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    keyed boolean;
BEGIN
    -- Held against retention's prune until this transaction ends (migration 0023).
    SELECT fair OR max_claimed_per_key IS NOT NULL INTO keyed FROM todos_queue WHERE name = NEW.queue FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO todos_queue (name, created_at) VALUES (NEW.queue, now()) ON CONFLICT (name) DO NOTHING;
    ELSIF keyed AND NEW.state = 'pending' THEN
        PERFORM todos_register_fair_key(NEW.queue, NEW.fair_key);
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE TRIGGER todo_registers_queue BEFORE UPDATE OF queue ON todos_todo FOR EACH ROW EXECUTE FUNCTION todos_register_queue();
