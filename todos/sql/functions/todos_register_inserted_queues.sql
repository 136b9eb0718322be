-- Trigger, once per INSERT statement: register the statement's new queues and fair keys (0021).
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_register_inserted_queues()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- Hold the known queues' rows against retention's prune until this transaction ends (migration 0023).
    PERFORM 1 FROM todos_queue q WHERE q.name IN (SELECT n.queue FROM inserted_todos n)
    ORDER BY q.name COLLATE "C" FOR KEY SHARE OF q;
    INSERT INTO todos_queue (name, created_at)
    SELECT DISTINCT n.queue, now() FROM inserted_todos n
    WHERE NOT EXISTS (SELECT 1 FROM todos_queue q WHERE q.name = n.queue)
    ON CONFLICT (name) DO NOTHING;
    -- A queue registered just now is neither fair nor capped: only known queues can have keys to register.
    PERFORM todos_register_fair_key(k.queue, k.fair_key)
    FROM (SELECT DISTINCT n.queue, n.fair_key FROM inserted_todos n JOIN todos_queue q ON q.name = n.queue
          WHERE n.state = 'pending' AND (q.fair OR q.max_claimed_per_key IS NOT NULL)
          ORDER BY 1, 2) k;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE TRIGGER todo_inserts_register_queues AFTER INSERT ON todos_todo REFERENCING NEW TABLE AS inserted_todos FOR EACH STATEMENT EXECUTE FUNCTION todos_register_inserted_queues();
