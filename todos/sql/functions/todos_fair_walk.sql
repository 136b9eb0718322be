-- The fair claim's walk: the keys of one queue in (vtime, key) order, locked one at a time with SKIP
-- LOCKED, that have claimable work for this agent (todos/sql/claim.py, docs/architecture.md#fair-share-issue-22),
-- and, on a queue with rate_per_key (key_rate, issue 31), a whole token in their bucket (times their weight).
-- ROWS 4 (migration 0039): it returns at most the claim's quota of keys, one for a single claim. At the default
-- estimate of 1,000 keys, each key's backlog multiplied the fair claim's estimated cost by 1,000: two keys of
-- 10,000 todos costed its generic plan at ~9.2M units against ~33k, and the plan cache, comparing later custom
-- plans with that stale cost, planned every fair claim afresh (docs/benchmarks.md, issue 31's cost bar).
-- Since issue 31's reservations, a reserved todo (todos_fairready) is not the walk's: a contended turn already
-- charged it to its key, and CLAIM_FAIR_READY hands it out.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_walk(queue_name text, top smallint, agent text, quota integer, cap integer, key_rate double precision, weights jsonb)
 RETURNS TABLE(key text, vtime double precision)
 LANGUAGE plpgsql
 ROWS 4
AS $function$
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
            -- pending work at the top priority: one descent of todo_fair_pending; since issue 31 not past its
            -- start-by deadline (NOT_EXPIRED) nor held by a parked limit of its own (PARKED, todos/sql/flow.py):
            -- a key whose todos all wait on a quota wall would otherwise keep the lowest pass and win every walk
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM todos_todo t
                WHERE t.queue = queue_name AND t.fair_key = c.key AND t.state = 'pending' AND t.priority = top
                  AND (t.assignee IS NULL OR t.assignee = agent)
                  AND (t.expires_at IS NULL OR t.expires_at > now() OR t.claimed_at IS NOT NULL)
                  AND (t.limits IS NULL OR NOT EXISTS (
                      SELECT 1 FROM todos_limit l
                      WHERE l.name = ANY(t.limits) AND l.parked_until IS NOT NULL AND l.parked_until > now()))
                  -- not reserved (todos_fairready): already charged to the key by a contended turn
                  AND NOT EXISTS (SELECT 1 FROM todos_fairready r WHERE r.id = t.id));
            PERFORM 1 FROM todos_fairkey k WHERE k.queue = queue_name AND k.key = c.key AND k.vtime = c.vtime
                FOR NO KEY UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                busy := COALESCE(busy, c.key);
                CONTINUE;
            END IF;
            locked_any := true;
            CONTINUE WHEN cap IS NOT NULL AND todos_fair_live_leases(queue_name, c.key) >= cap;
            CONTINUE WHEN key_rate IS NOT NULL AND todos_fair_key_tokens(
                queue_name, c.key, key_rate * COALESCE((weights ->> c.key)::double precision, 1)) < 1;
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
                         AND (t.assignee IS NULL OR t.assignee = agent)
                         AND NOT EXISTS (SELECT 1 FROM todos_fairready r WHERE r.id = t.id))
           AND (cap IS NULL OR todos_fair_live_leases(queue_name, busy) < cap)
           AND (key_rate IS NULL OR todos_fair_key_tokens(
                queue_name, busy, key_rate * COALESCE((weights ->> busy)::double precision, 1)) >= 1) THEN
            key := busy;
            vtime := pass;
            RETURN NEXT;
        END IF;
    END IF;
END
$function$;
