"""The queue registry's triggers hold the queue rows they rely on (issue 28, M4: retention prunes queues).

`manage.py purge` now deletes todos_queue rows of queues left empty and never configured (todos/retention.py).
A create into an existing queue registers nothing: its trigger finds the row and moves on. Had it only read
the row, a purge could delete it meanwhile (it cannot see the create's uncommitted todo), leaving a todo
whose queue no claim expands to. So the triggers now take FOR KEY SHARE on the rows of the queues they write
to, as a foreign key's check does, until the create commits: the purge locks with SKIP LOCKED and passes a
held row over. A purge that locked the row first makes the trigger wait; after the wait the row is gone,
and the trigger's next statement (a fresh snapshot) registers the queue again. FOR KEY SHARE conflicts with
neither the claim's nor the controls' updates of a queue row (they change no key), only with its delete.

For the merge with issue 34 (main's todos/sql/functions/): these two texts are the files
todos_register_inserted_queues.sql and todos_register_queue.sql, loaded by a migration after 0022.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION todos_register_inserted_queues()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- Hold the known queues' rows against retention's prune until this transaction ends (migration 0022).
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

CREATE OR REPLACE FUNCTION todos_register_queue()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    keyed boolean;
BEGIN
    -- Held against retention's prune until this transaction ends (migration 0022).
    SELECT fair OR max_claimed_per_key IS NOT NULL INTO keyed FROM todos_queue WHERE name = NEW.queue FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO todos_queue (name, created_at) VALUES (NEW.queue, now()) ON CONFLICT (name) DO NOTHING;
    ELSIF keyed AND NEW.state = 'pending' THEN
        PERFORM todos_register_fair_key(NEW.queue, NEW.fair_key);
    END IF;
    RETURN NEW;
END
$function$;
"""

BACKWARD = """
CREATE OR REPLACE FUNCTION todos_register_inserted_queues()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO todos_queue (name, created_at)
    SELECT DISTINCT n.queue, now() FROM inserted_todos n
    WHERE NOT EXISTS (SELECT 1 FROM todos_queue q WHERE q.name = n.queue)
    ON CONFLICT (name) DO NOTHING;
    PERFORM todos_register_fair_key(k.queue, k.fair_key)
    FROM (SELECT DISTINCT n.queue, n.fair_key FROM inserted_todos n JOIN todos_queue q ON q.name = n.queue
          WHERE n.state = 'pending' AND (q.fair OR q.max_claimed_per_key IS NOT NULL)
          ORDER BY 1, 2) k;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION todos_register_queue()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    keyed boolean;
BEGIN
    SELECT fair OR max_claimed_per_key IS NOT NULL INTO keyed FROM todos_queue WHERE name = NEW.queue;
    IF NOT FOUND THEN
        INSERT INTO todos_queue (name, created_at) VALUES (NEW.queue, now()) ON CONFLICT (name) DO NOTHING;
    ELSIF keyed AND NEW.state = 'pending' THEN
        PERFORM todos_register_fair_key(NEW.queue, NEW.fair_key);
    END IF;
    RETURN NEW;
END
$function$;
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0021_register_queues_per_statement")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
