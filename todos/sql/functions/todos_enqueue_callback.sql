-- Trigger, per row, after an UPDATE OF state of a todo with a callback (issue 29): when it has become done
-- or a dead-letter and its callback wants that event, enqueue the callback's delivery, a todo of the system
-- queue _switchboard.notify (todos/notices.py), in the same statement and so in the same transaction as
-- the transition: a delivery is never lost to a crash between the two, and never made for a rolled-back
-- one. The trigger's WHEN keeps todos without a callback (nearly all) from calling this function at all.
-- Idempotent per (todo, event, attempt): a dead-letter retried and dead-lettered again calls back again.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_enqueue_callback()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    event text := CASE WHEN NEW.state = 'done' THEN 'done' ELSE 'dead_lettered' END;
BEGIN
    IF NOT COALESCE(NEW.callback -> 'events' ? event, false) THEN
        RETURN NULL;
    END IF;
    INSERT INTO todos_todo (id, queue, source, kind, title, payload, idempotency_key, state, attempt, max_attempts,
        errors, created_at, updated_at, run_at, priority, dependencies_left, on_dependency_failure, has_dependents,
        fair_key)
    VALUES ('td_' || replace(gen_random_uuid()::text, '-', ''), '_switchboard.notify', '', 'notify.callback',
        left('todo.' || event || ' of ' || NEW.id || ' to ' || (NEW.callback ->> 'url'), 500),
        jsonb_build_object('channel', 'callback', 'todo', NEW.id, 'event', 'todo.' || event,
            'url', NEW.callback ->> 'url', 'agent', NEW.callback ->> 'agent'),
        'notify:callback:' || NEW.id || ':' || event || ':' || NEW.attempt,
        'pending', 0, COALESCE((NEW.callback ->> 'max_attempts')::integer, 8), '[]'::jsonb, now(), now(), now(),
        0, 0, 'cancel', false, '')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE TRIGGER todo_enqueues_callback AFTER UPDATE OF state ON todos_todo FOR EACH ROW WHEN (((new.callback IS NOT NULL) AND (((new.state)::text = 'done'::text) OR (((new.state)::text = 'failed'::text) AND (new.next_retry_at IS NULL))) AND ((old.state)::text IS DISTINCT FROM (new.state)::text))) EXECUTE FUNCTION todos_enqueue_callback();
