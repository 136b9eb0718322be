"""The queue registry's trigger on INSERT runs once per statement, not once per row (issue 20: batch create).

0009/0014/0016's row trigger (todos_register_queue) probed todos_queue for every row inserted: about 7 ms of a
1,000-item batch's ~45 ms INSERT (docs/benchmarks.md, "Batch create"). An AFTER INSERT ... FOR EACH STATEMENT
trigger reads the statement's new rows as a transition table and does the same work once per distinct queue
(and per distinct fair key): register an unknown queue (reading first, as 0014 does, so a known queue never
waits on its row's lock), and register the fair key of pending rows on fair or per-key-capped queues (0016's
todos_register_fair_key, in (queue, key) order). The row trigger stays for UPDATE OF queue, unchanged.

A later migration that changes what the registry does on insert changes todos_register_inserted_queues.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION todos_register_inserted_queues() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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
$$;
DROP TRIGGER todo_registers_queue ON todos_todo;
CREATE TRIGGER todo_registers_queue BEFORE UPDATE OF queue ON todos_todo
    FOR EACH ROW EXECUTE FUNCTION todos_register_queue();
CREATE TRIGGER todo_inserts_register_queues AFTER INSERT ON todos_todo
    REFERENCING NEW TABLE AS inserted_todos
    FOR EACH STATEMENT EXECUTE FUNCTION todos_register_inserted_queues();
"""

BACKWARD = """
DROP TRIGGER todo_inserts_register_queues ON todos_todo;
DROP FUNCTION todos_register_inserted_queues();
DROP TRIGGER todo_registers_queue ON todos_todo;
CREATE TRIGGER todo_registers_queue BEFORE INSERT OR UPDATE OF queue ON todos_todo
    FOR EACH ROW EXECUTE FUNCTION todos_register_queue();
"""


class Migration(migrations.Migration):
    # Issued as 0021 after 0017; main took 0020 (one fan-in) meanwhile, so it follows that.
    dependencies = [("todos", "0020_one_fan_in")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
