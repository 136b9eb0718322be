"""Fair share (issue 22): todos' fair_key, the queue's fair settings, the per-(queue, key) pass kept by the
claim statement, and the registry of keys with pending work on fair queues.

* todo_fair_pending (queue, fair_key, priority, run_at) WHERE pending: one key's pending todos in claim
  order. Pending rows only, so a claim or a complete of any queue writes no entry (a create writes one).
  CONCURRENTLY, as in 0006.
* todos_fairkey rows are registered by the todo table's triggers when a key gets pending work on a fair
  queue (a create, or an update into pending: the reaper's requeue, a release, an operator's retry), and
  deleted by the claim when the key has none left (see FUNCTIONS). The registering trigger of 0009/0014
  reads the queue's row anyway; it now reads `fair` in the same probe, so plain queues pay nothing more.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

FUNCTIONS = """
-- A key gets pending work on a fair queue: make sure it is registered. FOR KEY SHARE holds the row against
-- the claim's delete of an idle key (which locks with SKIP LOCKED and passes a locked row over) until this
-- transaction ends; it does not conflict with the claim's update of the pass. A row deleted meanwhile is
-- not found after the wait, and is inserted again.
CREATE FUNCTION todos_register_fair_key(queue_name text, fair_key text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM todos_fairkey WHERE queue = queue_name AND key = fair_key FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO todos_fairkey (queue, key, vtime) VALUES (queue_name, fair_key, 0) ON CONFLICT DO NOTHING;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION todos_register_queue() RETURNS trigger LANGUAGE plpgsql AS $$
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
$$;

-- Updates into pending (transitions never change the queue, so 0009's trigger does not fire for them).
-- The WHEN is checked without calling the function: claims and completes pay nothing.
CREATE FUNCTION todos_pending_fair_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM todos_queue WHERE name = NEW.queue AND (fair OR max_claimed_per_key IS NOT NULL)) THEN
        PERFORM todos_register_fair_key(NEW.queue, NEW.fair_key);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER todo_pending_registers_fair_key AFTER UPDATE OF state ON todos_todo
    FOR EACH ROW WHEN (NEW.state = 'pending' AND OLD.state <> 'pending')
    EXECUTE FUNCTION todos_pending_fair_key();

-- A key's live leases, with a fresh snapshot (the claim holds the fair queue's row lock when it asks:
-- see todos_live_leases in 0014, and issue 13's lesson). Served by todo_live_leases (queue, lease_expires_at).
CREATE FUNCTION todos_fair_live_leases(queue_name text, fair_key text) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*) FROM todos_todo t
            WHERE t.queue = queue_name AND t.state = 'claimed' AND t.lease_expires_at >= now()
              AND t.fair_key = todos_fair_live_leases.fair_key);
END
$$;

-- The claim's walk (todos/sql.py, CLAIM_NEXT): the first `quota` keys in pass order that have pending work
-- at priority `top` for `agent` and live leases below `cap`, each locked FOR NO KEY UPDATE SKIP LOCKED: a
-- concurrent claimer takes the next key instead of waiting (the lock does not conflict with a create's
-- FOR KEY SHARE). The keys are read in order first, then locked one by one only if their pass is still
-- the one read: a key that another claimer took meanwhile has moved on, and a lock on its new row would
-- take it out of turn (a locking read re-checks the changed row's conditions, not its place in the order).
-- The cap's count is taken after the lock, with a fresh snapshot (issue 13's lesson). A function, so that
-- each of its queries sees what claims committed after the claim statement's own snapshot.
CREATE FUNCTION todos_fair_walk(queue_name text, top smallint, agent text, quota integer, cap integer)
RETURNS TABLE (key text, vtime double precision) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    c record;
    held integer := 0;
    after_vtime double precision := '-infinity';
    after_key text := '';
    seen integer;
    busy text;
    locked_any boolean := false;
    pass double precision;
BEGIN
    -- Pages of 16 keys in (vtime, key) order, each page one range scan of fair_key_walk (an unbounded ordered
    -- query may be planned as a scan and sort of every key of the queue).
    LOOP
        seen := 0;
        FOR c IN
            SELECT k.key, k.vtime FROM todos_fairkey k
            WHERE k.queue = queue_name AND (k.vtime, k.key) > (after_vtime, after_key)
            ORDER BY k.vtime, k.key
            LIMIT 16
        LOOP
            seen := seen + 1;
            after_vtime := c.vtime;
            after_key := c.key;
            -- pending work at the top priority: one descent of todo_fair_pending
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM todos_todo t
                WHERE t.queue = queue_name AND t.fair_key = c.key AND t.state = 'pending' AND t.priority = top
                  AND (t.assignee IS NULL OR t.assignee = agent));
            PERFORM 1 FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = c.key AND k.vtime = c.vtime
                FOR NO KEY UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                busy := COALESCE(busy, c.key);
                CONTINUE;
            END IF;
            locked_any := true;
            CONTINUE WHEN cap IS NOT NULL AND todos_fair_live_leases(queue_name, c.key) >= cap;
            key := c.key;
            vtime := c.vtime;
            RETURN NEXT;
            held := held + 1;
            EXIT WHEN held >= quota;
        END LOOP;
        EXIT WHEN held >= quota OR seen < 16;
    END LOOP;
    -- Every key with work was held by other claimers (more claimers than keys): wait for the first of them
    -- rather than answer empty while work is there (a long-poll answered empty sleeps until a NOTIFY). Only
    -- while holding no key (one locked and found at its cap, say): a claimer that waits holding one could
    -- close a cycle with the holder of the other.
    IF held = 0 AND busy IS NOT NULL AND NOT locked_any THEN
        SELECT k.vtime INTO pass FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = busy FOR NO KEY UPDATE;
        IF FOUND
           AND EXISTS (SELECT 1 FROM todos_todo t
                       WHERE t.queue = queue_name AND t.fair_key = busy AND t.state = 'pending'
                         AND (t.assignee IS NULL OR t.assignee = agent))
           AND (cap IS NULL OR todos_fair_live_leases(queue_name, busy) < cap) THEN
            key := busy;
            vtime := pass;
            RETURN NEXT;
        END IF;
    END IF;
END
$$;

-- One key, locked as the walk locks it (registered first if it has no row), if its live leases are below
-- `cap`: the keys of lapsed, due and scheduled todos, and a claim by id (`wait`: it waits for the lock).
CREATE FUNCTION todos_fair_lock_key(queue_name text, fair_key text, cap integer, wait boolean)
RETURNS TABLE (key text, vtime double precision) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    pass double precision;
BEGIN
    -- A plain read first: an insert attempt on a row another claimer is updating would wait for it.
    PERFORM 1 FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = fair_key;
    IF NOT FOUND THEN
        INSERT INTO todos_fairkey AS k (queue, key, vtime) VALUES (queue_name, fair_key, 0) ON CONFLICT DO NOTHING;
    END IF;
    IF wait THEN
        SELECT k.vtime INTO pass FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = fair_key
        FOR NO KEY UPDATE;
    ELSE
        SELECT k.vtime INTO pass FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = fair_key
        FOR NO KEY UPDATE SKIP LOCKED;
    END IF;
    IF FOUND AND (cap IS NULL OR todos_fair_live_leases(queue_name, fair_key) < cap) THEN
        RETURN QUERY SELECT fair_key, pass;
    END IF;
END
$$;

-- Whether a key still has pending work, with a fresh snapshot: the claim deletes an idle key's row only
-- after it has locked the row, so a create that committed meanwhile is seen here. Served by todo_fair_pending.
CREATE FUNCTION todos_fair_key_pending(queue_name text, fair_key text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM todos_todo t
                   WHERE t.queue = queue_name AND t.fair_key = todos_fair_key_pending.fair_key AND t.state = 'pending');
END
$$;
"""

FUNCTIONS_BACKWARD = """
DROP TRIGGER todo_pending_registers_fair_key ON todos_todo;
DROP FUNCTION todos_pending_fair_key();
DROP FUNCTION todos_fair_live_leases(text, text);
DROP FUNCTION todos_fair_key_pending(text, text);
DROP FUNCTION todos_fair_walk(text, smallint, text, integer, integer);
DROP FUNCTION todos_fair_lock_key(text, text, integer, boolean);
CREATE OR REPLACE FUNCTION todos_register_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM todos_queue WHERE name = NEW.queue) THEN
        INSERT INTO todos_queue (name, created_at) VALUES (NEW.queue, now()) ON CONFLICT (name) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;
DROP FUNCTION todos_register_fair_key(text, text);
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        # After main's 0015, 0019 and 0018 (merged beside this branch); the coordinator relinks.
        ("todos", "0018_delegation_progress_checkpoint_trace"),
    ]

    operations = [
        migrations.CreateModel(
            name="FairKey",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "queue", "key", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("queue", models.CharField(max_length=200)),
                ("key", models.CharField(max_length=200)),
                ("vtime", models.FloatField(db_default=0.0, default=0.0)),
            ],
        ),
        migrations.AddField(
            model_name="queue",
            name="fair",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="fair_round",
            field=models.FloatField(db_default=0.0, default=0.0, editable=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="fair_weights",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.AddField(
            model_name="queue",
            name="max_claimed_per_key",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="fair_key",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                models.F("queue"),
                models.F("fair_key"),
                models.F("priority"),
                models.F("run_at"),
                condition=models.Q(("state", "pending")),
                name="todo_fair_pending",
            ),
        ),
        migrations.AddIndex(
            model_name="fairkey",
            index=models.Index(fields=["queue", "vtime", "key"], name="fair_key_walk"),
        ),
        migrations.AddField(
            model_name="schedule",
            name="fair_key",
            field=models.CharField(
                blank=True, default="", help_text="On a fair queue: whose share its todos take.", max_length=200
            ),
        ),
        migrations.RunSQL(FUNCTIONS, FUNCTIONS_BACKWARD),
    ]
