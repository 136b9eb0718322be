-- Trigger, per row, after an UPDATE OF state or waiting_for of a todo with an A2A push notification config
-- (issue 33; todos/a2a/push.py): when the task's A2A state may have changed, enqueue one delivery per config
-- of the task, a todo of the system queue _switchboard.notify (todos/notices.py), in the same statement and
-- so in the same transaction as the transition: never lost to a crash between the two, never made for a
-- rolled-back one. The trigger's WHEN keeps todos without a config (a2a_push null: nearly all) from calling
-- this function at all, so claims and completes of other todos pay nothing.
-- States sent: pending again (submitted: released, requeued after a lapse, retried, or its wait resolved),
-- claimed and waiting (working, or input-required when it waits for a token, a person or a manual resolve),
-- done (completed), a dead-letter (failed) and cancelled (canceled); a retry-wait is still "working" to the
-- client, and sends nothing.
-- The configs are read by their unique index (todo_id, config_id). Idempotent per (config, transaction,
-- state): the sender (todos/outbound.py) renders the task as it is when it sends.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_enqueue_a2a_push()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.state = 'scheduled' OR (NEW.state = 'failed' AND NEW.next_retry_at IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    INSERT INTO todos_todo (id, queue, source, kind, title, payload, idempotency_key, state, attempt, max_attempts,
        errors, created_at, updated_at, run_at, priority, dependencies_left, on_dependency_failure, has_dependents,
        fair_key)
    SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), '_switchboard.notify', '', 'notify.a2a',
        left('A2A push of ' || NEW.id || ' (' || NEW.state || ') to ' || config.url, 500),
        jsonb_build_object('channel', 'a2a', 'todo', NEW.id, 'config', config.id, 'state', NEW.state),
        'notify:a2a:' || config.id || ':' || txid_current() || ':' || NEW.state,
        'pending', 0, config.max_attempts, '[]'::jsonb, now(), now(), now(), 0, 0, 'cancel', false, ''
    FROM todos_a2apushconfig config
    WHERE config.todo_id = NEW.id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE TRIGGER todo_enqueues_a2a_push AFTER UPDATE OF state, waiting_for ON todos_todo FOR EACH ROW WHEN (((new.a2a_push IS TRUE) AND (((old.state)::text IS DISTINCT FROM (new.state)::text) OR (old.waiting_for IS DISTINCT FROM new.waiting_for)))) EXECUTE FUNCTION todos_enqueue_a2a_push();
