-- children: "cancel" (issue 30): a todo created with it that finishes (done, a dead-letter, cancelled), by
-- whichever statement, cancels what is left under it in that statement, up to todos.limits.CASCADE_BATCH
-- (10000, written here: a trigger takes no parameter) descendants; reap_once finishes a bigger tree. Every
-- queue ('%'): the tree's creator chose the policy. The WHEN clause costs a todo without the policy a
-- comparison; nothing else runs.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_children_cancel()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM todos_cascade(ARRAY[NEW.id], 'switchboard',
        'finished ' || CASE WHEN NEW.state = 'failed' THEN 'dead-letter' ELSE NEW.state END || ' (children: cancel)',
        ARRAY['%'], 10000);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE TRIGGER todo_finish_cancels_children AFTER UPDATE OF state ON todos_todo FOR EACH ROW WHEN ((((new.children)::text = 'cancel'::text) AND ((old.state)::text IS DISTINCT FROM (new.state)::text) AND (((new.state)::text = 'done'::text) OR ((new.state)::text = 'cancelled'::text) OR (((new.state)::text = 'failed'::text) AND (new.next_retry_at IS NULL))))) EXECUTE FUNCTION todos_children_cancel();
