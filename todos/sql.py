"""Every hand-written statement of the queue, named for its transition (procrastinate and river keep
theirs the same way). Each is ONE statement: the guard sits in the WHERE clause, times come from the
database's now() (SPEC decision 7), and RETURNING hands back the row as it is after the change.

Why raw SQL here and the ORM elsewhere: the claim scan needs one index lookup per queue (a LATERAL
join, SPEC trap 1) and every transition must be a single guarded UPDATE ... RETURNING (trap 2);
Django's ORM can express neither. `make bench` measures the result against the same
cycle written directly against psycopg.

Parameters common to several statements:
  visible   LIKE patterns of the queues the caller may see (its scopes; ['%'] for the system)
  agent     the agent's name; a claim's owner is "<agent>" or "<agent>/<worker>"

Conditions on a todo's state come from todos/states.py (``S.DEAD_LETTER.sql("t")``), so each is written
once; the index each statement relies on is the one whose predicate is that same condition
(todos/models.py).
"""

from todos import states as S

# Scheduling (issue 12): its conditions (S.SCHEDULED_DUE, the claim order, ...) are in todos/states.py.
# Claim order, everywhere a claim chooses: priority first (lower first), then time (run_at).
CLAIM_ORDER = S.claim_order_sql()
# create: a run_at in the future makes a scheduled todo; otherwise pending. %(run_at)s is the caller's
# run_at, or NULL for now() + %(delay)s seconds (NULL: none).
_RUN_AT = "COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => COALESCE(%(delay)s::double precision, 0)))"
_CREATED_STATE = f"CASE WHEN {_RUN_AT} > now() THEN '{S.TodoState.SCHEDULED}' ELSE '{S.TodoState.PENDING}' END"
# A scheduled create wakes the long-polls of its queue only when it falls due within the longest wait
# (todos/api/serializers.py MAX_WAIT_SECONDS): a waiter then re-reads its next wake time
# (todos/selectors.py seconds_until_claimable) and wakes at run_at. Later ones are found by the waits
# that start after them; NOTIFYing those would wake waiters for nothing.
SCHEDULED_NOTIFY_HORIZON_SECONDS = 20

# Also the unique constraint todo_runnable_idempotency_key's condition (todos/models.py); ON CONFLICT
# must repeat it for PostgreSQL to pick that partial index as the arbiter.
_RUNNABLE_KEY = f"idempotency_key IS NOT NULL AND {S.RUNNABLE.sql()}"

_TODO_COLUMNS = """id, queue, source, kind, title, payload, event_id, idempotency_key, assignee, state, owner,
    lease_expires_at, attempt, max_attempts, result, created_at, updated_at, claimed_at, completed_at,
    next_retry_at, lease_id, errors, run_at, priority, waiting_for, resolution, awaited_by, awaited_left,
    progress, checkpoint, traceparent, fair_key"""
# Every statement that hands back todos returns these columns, in this order: todos/queue.py builds
# Todos from them by position.
TODO_COLUMNS = _TODO_COLUMNS

# The caller holds the current receipt. A receipt stays current until the todo is claimed again
# (which issues a new lease_id) or is completed, failed, released or retried by an operator
# (which clear it); a lapse alone does not void it, so a slow worker whose todo has not been
# re-claimed may still heartbeat, complete or fail it (SPEC decision 2), whether or not the
# reaper has swept it yet.
_HOLDS_RECEIPT = """id = %(id)s AND lease_id = %(lease_id)s AND split_part(owner, '/', 1) = %(agent)s
    AND queue LIKE ANY(%(visible)s::text[])"""

_LEASE_EXPIRED_ERROR = """jsonb_build_array(jsonb_build_object(
    'attempt', t.attempt, 'at', t.lease_expires_at, 'error', 'lease expired'))"""

# Transitions that make work claimable at once NOTIFY this channel with the queue's name, inside
# their own statement (no extra round trip); todos/waiting.py wakes that many long-polling claims of
# that queue (a statement that changed n > 1 rows of a queue says "<queue> <n>"). A NOTIFY is
# delivered when the transaction commits, so a woken claimer sees the row, and PostgreSQL
# folds identical (channel, payload) pairs of one transaction into one.
NOTIFY_CHANNEL = "switchboard_todos"


def _notifying(changed: str, when: str = "true") -> str:
    """Wrap a data-modifying statement (``changed``, with RETURNING queue, ...) so that it also
    notifies each distinct queue of the rows that satisfy ``when``, with their count when more than
    one; it returns the same rows."""
    return f"""
WITH changed AS ({changed}),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM changed WHERE {when} GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# A resolved todo is runnable at once (scheduled instead if a dependency of a future run_at, never
# claimed, is what it waited for: that is the only shape a scheduled todo may have). ``by`` and ``detail``
# are SQL: who resolved it and the jsonb merged into its resolution.
def _resolved_set(by: str, detail: str = "'{}'::jsonb", alias: str = "t", when: str | None = None) -> str:
    """The SET list that resolves a waiting todo; with ``when``, only rows for which it holds (others keep
    their values: for a statement that also updates rows it does not resolve)."""

    def only(value: str, column: str) -> str:
        return value if when is None else f"CASE WHEN {when} THEN {value} ELSE {alias}.{column} END"

    state = (
        f"CASE WHEN {alias}.run_at > now() AND {alias}.owner IS NULL THEN '{S.TodoState.SCHEDULED}' "
        f"ELSE '{S.TodoState.PENDING}' END"
    )
    entry = f"""{alias}.errors || jsonb_build_array(jsonb_build_object(
        'attempt', {alias}.attempt, 'at', now(), 'error', 'wait resolved', 'by', {by}))"""
    return f"""
    state = {only(state, "state")},
    waiting_for = {only("NULL", "waiting_for")},
    resolution = {only(f"jsonb_build_object('by', {by}, 'at', now()) || {detail}", "resolution")},
    errors = {only(entry, "errors")},
    updated_at = {only("now()", "updated_at")}"""


# What counts as finished for a todo that others wait for: done, cancelled or dead-lettered.
FINISHED = S.DONE | S.CANCELLED | S.DEAD_LETTER

# For the hook below, on a waiter p (its latest version) and f.ids, the todos of this statement that
# finished and name p in their awaited_by: whether its current wait is for any of them (awaited_left is
# set by each wait on todos and cleared by any other wait, so an edge left by an earlier wait counts for
# nothing), what is left once they are taken off, and whether that is nothing.
_COUNTS = f"({S.WAITING.sql('p')} AND p.awaited_left && f.ids)"
_LEFT = "ARRAY(SELECT x FROM unnest(p.awaited_left) x WHERE x <> ALL(f.ids))::varchar(40)[]"
_RESOLVES = f"({_COUNTS} AND cardinality({_LEFT}) = 0)"


def _finishing(changed: str, *, finished: str, notify_when: str = "false", before: str = "") -> str:
    """Wrap a data-modifying statement (``changed``, RETURNING at least id, queue and awaited_by) whose
    rows may finish todos that others wait for (``finished``: a condition on its rows, alias c). In the
    same statement each waiter named in a finished row's awaited_by takes it off its awaited_left; one
    left with nothing becomes pending (resolution by "todos"). Notifies the queues of ``changed``'s rows
    that satisfy ``notify_when`` and of every todo it woke; returns ``changed``'s rows. ``before``: CTEs
    that ``changed`` reads (a WITH cannot nest a data-modifying one).

    Why this cannot miss a wake: awaited_by comes from the row this statement updated, in its latest
    version (a statement that waited for a lock re-reads the row), and queue.wait writes the edge by
    updating that row. So either the wait's write came first and the finishing statement sees the edge,
    or the finish came first and the wait, re-reading the row under its lock, counts it finished. The
    waiter's row is found by id, and its latest version is what the CASEs read (its state, its list):
    siblings finishing concurrently take its lock in turn and each takes itself off the last list. Most todos
    have no awaited_by: the hook then costs nothing but an empty unnest."""
    return f"""
WITH {before}changed AS ({changed}),
woken AS (
    UPDATE todos_todo p SET
        awaited_left = CASE WHEN {_COUNTS} THEN {_LEFT} ELSE p.awaited_left END,
        {_resolved_set("'todos'", "jsonb_build_object('todos', p.waiting_for->'todos')", "p", when=_RESOLVES)}
    FROM (
        SELECT w.waiter, array_agg(c.id) AS ids
        FROM changed c CROSS JOIN LATERAL unnest(c.awaited_by) AS w(waiter)
        WHERE {finished}
        GROUP BY w.waiter
    ) f
    WHERE p.id = f.waiter AND p.id NOT IN (SELECT id FROM changed)
    RETURNING p.queue, p.state
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM (
        SELECT queue FROM changed WHERE {notify_when}
        UNION ALL SELECT queue FROM woken WHERE {S.PENDING.sql("woken")}
    ) q GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# create: -> pending, or -> scheduled when run_at is in the future. A row comes back only if it was
# inserted; none means a runnable todo with the same (queue, idempotency_key) exists (read it with
# RUNNABLE_BY_KEY). The queue's name is registered by the todo table's trigger (migration 0009), in the
# same statement, whatever path writes the row.
CREATE = f"""
WITH inserted AS (
INSERT INTO todos_todo (id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
    state, attempt, max_attempts, errors, created_at, updated_at, run_at, priority, traceparent, fair_key)
VALUES (%(id)s, %(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s, %(event_id)s, %(idempotency_key)s,
    %(assignee)s, {_CREATED_STATE}, 0, %(max_attempts)s, '[]'::jsonb, now(), now(), {_RUN_AT}, %(priority)s,
    %(traceparent)s, %(fair_key)s)
ON CONFLICT (queue, idempotency_key) WHERE {_RUNNABLE_KEY} DO NOTHING
RETURNING {_TODO_COLUMNS}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM inserted
    WHERE {S.PENDING.sql()} OR run_at <= now() + make_interval(secs => {SCHEDULED_NOTIFY_HORIZON_SECONDS})
)
SELECT inserted.* FROM inserted CROSS JOIN (SELECT count(*) FROM notified) n
"""

RUNNABLE_BY_KEY = f"""
SELECT {_TODO_COLUMNS} FROM todos_todo
WHERE queue = %(queue)s AND idempotency_key = %(idempotency_key)s AND {_RUNNABLE_KEY}
"""

# What a claim may take: pending, a lapsed lease below its cap (SPEC decision 1; one at its cap is
# never handed out again, the reaper dead-letters it), a failed todo whose retry is due, or a scheduled
# todo whose run_at has come. The assignee, if any, must be the claimer.
_CLAIMABLE = f"""(t.assignee IS NULL OR t.assignee = %(agent)s) AND {S.CLAIMABLE.sql("t")}"""

_CLAIM_SET = f"""
    state = 'claimed',
    attempt = t.attempt + 1,
    owner = %(owner)s,
    lease_id = 'ls_' || replace(gen_random_uuid()::text, '-', ''),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    claimed_at = now(),
    updated_at = now(),
    next_retry_at = NULL,
    -- re-claiming a lapsed lease before the reaper saw it records the lapse, as the reaper would, and
    -- when this claim took it over (reclaimed_at = this claim's claimed_at: the metrics count these)
    errors = CASE WHEN {S.CLAIMED.sql("t")} THEN t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', t.lease_expires_at, 'error', 'lease expired', 'reclaimed_at', now()))
        ELSE t.errors END"""

_RETURNING_T = ", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))


# Queue controls (issue 11), the CTEs every claim starts with. ``eligible`` is a condition on todos_queue q:
# the queues this claim may take from. Each comes out of ``quotas`` with how many todos this claim may
# take from it (%(limit)s for an unlimited queue; a paused queue is not there at all).
#  * Plain queues (no limit, not keyed) are read as in wave 1: no lock, no count, no write. ``limited`` is
#    then empty, and every branch below that only a controlled queue needs hangs off it: PostgreSQL runs
#    none of them (issue 19: a plain queue's claim back at wave 1's cost).
#  * A limited queue's row is locked FOR UPDATE, and a concurrent claimer of it WAITS (no SKIP LOCKED):
#    skipping would hand it an empty list while the holder may leave slots or tokens over, and a
#    long-poll refused that way would sleep with work claimable. The wait is one claim statement long;
#    claimers of a limited queue take turns, which is what a limit means. Rows are locked in name order,
#    so claimers of several limited queues cannot deadlock.
#  * After the wait the row is the latest version (READ COMMITTED re-reads a locked row), but this
#    statement's snapshot is older than the claims that committed meanwhile: the live leases are counted
#    by todos_live_leases() (migration 0014), a VOLATILE function whose query takes a fresh snapshot.
#  * The token bucket refills by the time elapsed times the rate, capped at the burst; the claim takes at
#    most floor(tokens), and ``queue_writeback`` writes back what it took, in the same statement, under the
#    lock. A claim that takes nothing writes nothing: refilling later from the old refilled_at gives the same.
#    GREATEST: a claimer whose transaction started before the last writer's never refills backwards.
#  * A keyed queue (fair, or with max_claimed_per_key: issue 22) is not locked: its claimers lock keys
#    instead (CLAIM_NEXT's fair branch), so they run side by side.
_KEYED = "(q.fair OR q.max_claimed_per_key IS NOT NULL)"


def _queue_quotas(eligible: str) -> str:
    return f"""queues AS MATERIALIZED (
    SELECT q.name, (q.max_claimed IS NOT NULL OR q.rate_per_second IS NOT NULL) AS limited, {_KEYED} AS keyed,
        q.fair_weights, q.max_claimed_per_key AS key_cap, q.fair_round
    FROM todos_queue q
    WHERE {eligible} AND NOT q.paused
),
limited AS MATERIALIZED (
    SELECT q.name, q.max_claimed,
        CASE WHEN q.rate_per_second IS NOT NULL THEN LEAST(q.rate_burst::double precision, q.tokens
            + GREATEST(EXTRACT(EPOCH FROM now() - q.refilled_at)::double precision, 0) * q.rate_per_second) END
            AS tokens,
        queues.keyed
    FROM queues JOIN todos_queue q ON q.name = queues.name
    WHERE queues.limited AND NOT q.paused  -- re-checked on the latest row: a pause that committed meanwhile
    ORDER BY q.name
    FOR UPDATE OF q
),
quotas AS MATERIALIZED (
    SELECT name, %(limit)s::integer AS quota, keyed FROM queues WHERE NOT limited
    UNION ALL
    -- LEAST ignores NULLs: a control that is not set does not limit.
    SELECT name, GREATEST(LEAST(%(limit)s::integer,
        CASE WHEN max_claimed IS NOT NULL THEN max_claimed - todos_live_leases(name) END,
        floor(tokens)::integer), 0), keyed
    FROM limited
)"""


# The token bucket's write-back, under the queue's lock: ``taken`` is a query of (queue, n) for what this
# statement claimed.
def _bucket(taken: str) -> str:
    return f"""
bucket AS (
    UPDATE todos_queue q SET tokens = l.tokens - taken.n, refilled_at = GREATEST(q.refilled_at, now())
    FROM limited l JOIN ({taken}) taken ON taken.queue = l.name
    WHERE q.name = l.name AND l.tokens IS NOT NULL
)"""


# claim_next: up to %(limit)s todos in claim order (CLAIM_ORDER: priority, then run_at), from the
# caller's queues. Guard: _CLAIMABLE's cases, one branch each; locks: FOR UPDATE SKIP LOCKED per branch.
#  * Scope globs become concrete names through the small todos_queue table; then each queue's pending
#    rows are read by one descent of todo_pending_claim_scan (queue, priority, run_at) in claim order (a
#    LATERAL join), never by sorting every pending row (SPEC trap 1). Priority therefore holds within and
#    across the caller's queues, and for batch claims.
#  * Due scheduled todos come from todo_scheduled_due, also one descent per queue: the range
#    run_at <= now() ends at the first future row, so 1M todos scheduled for later cost a claim nothing.
#  * Queue controls: _queue_quotas above; each branch takes at most the queue's quota, and ``chosen``
#    keeps at most that many per queue across the branches, in claim order. With no limited queue among
#    the caller's, ``chosen`` is wave 1's: the candidates in claim order.
#  * Due retries come from todo_retry_queue_due, one descent per queue as for scheduled todos (migration
#    0019). Lapsed leases are few (the reaper keeps them so); they come from their partial index in
#    expiry order.
#  * The branches other than pending are taken in time order and their rows compete with pending ones in
#    claim order: until the reaper moves them to pending (within a sweep), a more urgent one further down
#    such a branch may wait behind a less urgent one above it; taking them by priority would mean sorting
#    the whole branch on every claim.
#  * Every branch locks with SKIP LOCKED, so concurrent claimers never wait for or share a row. The
#    CTEs are MATERIALIZED and the UPDATE takes the chosen ids as an array, so the locking scans run
#    exactly once, never take more than %(limit)s rows, and the update is a primary-key lookup per id
#    whatever the plan guessed (a join to chosen was once served by hashing the whole table).
#  * A branch may lock up to %(limit)s rows per queue that the final LIMIT does not take; those locks
#    end with this statement's transaction, a millisecond later.
#
# Fair share (issue 22), on a keyed queue (fair, or max_claimed_per_key set). Each key k has a pass
# vtime(k) in todos_fairkey; the queue has a round R (fair_round). A key's next claim starts at
# start(k) = max(vtime(k), R): a key that was idle rejoins at the current round and banks no credit.
# Among the pending todos of the queue's most urgent priority, the claim takes the key with the lowest
# start (ties: the lower key, by its text), its todos in claim order; the j-th todo a claim takes from k is
# tagged start(k) + (j - 1) / weight(k), and a batch takes the lowest tags. Afterwards
# vtime(k) = start(k) + n / weight(k) (n: the todos taken from k). Weighted round robin: while keys stay
# busy, k gets weight(k) / (the busy keys' weights summed) of the claims.
#  * Priority stays global: the walk looks only at keys with pending work at the priority of the queue's
#    most urgent pending todo (one descent of todo_pending_claim_scan), and candidates are ordered by
#    (priority, tag). Fairness shares the queue among tenants; priority says what must go first, and an
#    urgent todo waiting behind other tenants' routine ones would defeat it.
#  * The walk (todos_fair_walk, migration 0016) reads todos_fairkey in (queue, vtime, key) order and
#    stops at the first %(limit)s keys with pending work at that priority (an EXISTS on todo_fair_pending)
#    and live leases below the cap, locking each FOR NO KEY UPDATE SKIP LOCKED: concurrent claimers take
#    different keys side by side, and no key's pass or count is read by two at once. The queue's row is
#    not locked. The walk is a VOLATILE function: it must see the passes and leases that claims committed
#    after this statement's snapshot (issue 13: a snapshot older than the lock let 21 claims through a cap
#    of 3), and a key updated meanwhile is re-checked on its latest row, cap count included.
#  * The keys of lapsed, due and scheduled candidates are locked the same way (todos_fair_lock_key); they
#    compete by their key's tag and count toward its cap. A candidate whose key another claimer holds, or
#    that is at its cap, is left.
#  * R moves to the lowest start a claim took once it is a whole round (1) ahead, so it is written about
#    once a round rather than by every claim (the queue's row would serialize claimers): a returning key
#    may so start up to one round early, never more.
#  * A claim takes at most ceil(weight(k)) todos from a key (one round's worth), also in a batch: a claimer
#    that holds one key while others hold the rest then cannot take a whole batch from it out of turn. A
#    batch on a queue with few keys may so bring fewer than %(limit)s.
#  * Keys are registered by the todo table's triggers when they get pending work (migration 0016). The
#    key of the queue's most urgent pending todo is registered by the claim if it has no row (a create that
#    committed while the queue became fair): it is served from the next claim. A claim deletes those of the
#    8 lowest keys below the round that have nothing pending (lossless: such a key would rejoin at the
#    round anyway), after locking each (SKIP LOCKED: a create registering it holds it FOR KEY SHARE) and
#    re-checking with a fresh snapshot (todos_fair_key_pending).
#  * Plain queues run none of this: every fair CTE starts from ``fair_queues`` or the keyed ``quotas``,
#    which are then empty.
CLAIM_NEXT = f"""
WITH {_queue_quotas("q.name LIKE ANY(%(scopes)s::text[]) AND q.name LIKE ANY(%(wanted)s::text[])")},
pending AS MATERIALIZED (
    SELECT p.id, p.queue, p.priority, p.run_at, p.fair_key FROM (SELECT * FROM quotas WHERE NOT keyed) quotas
    CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        -- NULLS FIRST (run_at is never null, so the order is the same) matches only todo_pending_claim_scan,
        -- so no other index can ever serve this order: the planner once served the claim from the admin's
        -- created_at index and walked the done history at its head on every claim (migration 0007: in a
        -- 45 s soak, 10,000 buffers a claim, throughput down by two thirds).
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) p
),
fair_queues AS MATERIALIZED (
    SELECT k.name, k.quota, q.fair_weights, q.key_cap, q.fair_round, head.priority AS top, head.fair_key AS head_key
    FROM (SELECT * FROM quotas WHERE keyed AND quota > 0) k JOIN queues q ON q.name = k.name
    CROSS JOIN LATERAL (
        SELECT t.priority, t.fair_key FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = k.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT 1
    ) head
),
fair_register AS (
    INSERT INTO todos_fairkey (queue, key, vtime)
    SELECT fq.name, fq.head_key, 0 FROM fair_queues fq
    WHERE NOT EXISTS (SELECT FROM todos_fairkey k WHERE k.queue = fq.name AND k.key = fq.head_key)
    ON CONFLICT DO NOTHING
),
fair_keys AS MATERIALIZED (
    SELECT queue, key, start, weight, LEAST(%(limit)s::integer, ceil(weight)::integer, room) AS room FROM (
        SELECT fq.name AS queue, w.key, GREATEST(w.vtime, fq.fair_round) AS start,
            COALESCE((fq.fair_weights ->> w.key)::double precision, 1) AS weight,
            CASE WHEN fq.key_cap IS NOT NULL THEN fq.key_cap - todos_fair_live_leases(fq.name, w.key) END AS room
        FROM fair_queues fq CROSS JOIN LATERAL todos_fair_walk(fq.name, fq.top, %(agent)s, fq.quota, fq.key_cap) w
    ) k
),
fair_pending AS MATERIALIZED (
    SELECT p.id, p.queue, p.priority, p.run_at, p.fair_key FROM fair_keys fk CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = fk.queue AND t.fair_key = fk.key
          AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.priority, t.run_at
        LIMIT fk.room
        FOR UPDATE SKIP LOCKED
    ) p
),
scheduled AS MATERIALIZED (
    SELECT s.id, s.queue, s.priority, s.run_at, s.fair_key FROM (SELECT name, quota FROM quotas WHERE quota > 0) quotas
    CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key FROM todos_todo t
        WHERE {S.SCHEDULED_DUE.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.run_at
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) s
),
lapsed AS MATERIALIZED (
    SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key FROM todos_todo t
    WHERE {S.RECLAIMABLE.sql("t")}
      AND t.queue IN (SELECT name FROM quotas WHERE quota > 0) AND (t.assignee IS NULL OR t.assignee = %(agent)s)
    ORDER BY t.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
due AS MATERIALIZED (
    SELECT d.id, d.queue, d.priority, d.run_at, d.fair_key FROM (SELECT name, quota FROM quotas WHERE quota > 0) quotas
    CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key FROM todos_todo t
        WHERE {S.RETRY_DUE.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        -- NULLS FIRST (next_retry_at is never null here): only todo_retry_queue_due yields this order, so
        -- each queue's due range is one descent that stops after its quota. Across queues in due order,
        -- a generic plan once read every due retry of every queue through that index and sorted them.
        ORDER BY t.next_retry_at NULLS FIRST
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) d
),
candidates AS (
    SELECT * FROM pending UNION ALL SELECT * FROM scheduled UNION ALL SELECT * FROM lapsed UNION ALL SELECT * FROM due
),
-- A keyed queue's candidate keys, locked, with their start, weight and room under the cap: the walked ones,
-- and the keys of lapsed, due and scheduled candidates.
fair_rooms AS MATERIALIZED (
    SELECT * FROM fair_keys
    UNION ALL
    SELECT k.queue, lk.key, GREATEST(lk.vtime, q.fair_round), w.weight,
        LEAST(%(limit)s::integer, ceil(w.weight)::integer,
            CASE WHEN q.key_cap IS NOT NULL THEN q.key_cap - todos_fair_live_leases(k.queue, lk.key) END)
    FROM (
        SELECT DISTINCT c.queue, c.fair_key FROM candidates c JOIN queues q ON q.name = c.queue AND q.keyed
        WHERE NOT EXISTS (SELECT FROM fair_keys fk WHERE fk.queue = c.queue AND fk.key = c.fair_key)
    ) k JOIN queues q ON q.name = k.queue
    CROSS JOIN LATERAL todos_fair_lock_key(k.queue, k.fair_key, q.key_cap, false) lk
    CROSS JOIN LATERAL (SELECT COALESCE((q.fair_weights ->> lk.key)::double precision, 1) AS weight) w
),
chosen AS MATERIALIZED (
    -- No limited or keyed queue among the caller's (a one-time filter): the candidates in claim order, as
    -- wave 1 took them.
    (SELECT id, queue, fair_key FROM candidates WHERE NOT EXISTS (SELECT FROM queues WHERE limited OR keyed)
     ORDER BY {CLAIM_ORDER} LIMIT %(limit)s)
    UNION ALL
    -- Otherwise nth, the candidate's place in its queue, keeps no queue above its quota; in a keyed queue
    -- the candidates go by (priority, tag), only those of keys this claim holds, no key above its room.
    (SELECT id, queue, fair_key FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.tag, c.run_at) AS nth
        FROM (
            SELECT c.*, r.key AS held, r.room, r.start + (c.nth_key - 1) / r.weight AS tag FROM (
                SELECT c.*,
                    row_number() OVER (PARTITION BY c.queue, c.fair_key ORDER BY c.priority, c.run_at) AS nth_key
                FROM (SELECT * FROM candidates UNION ALL SELECT * FROM fair_pending) c
                WHERE EXISTS (SELECT FROM queues WHERE limited OR keyed)
            ) c LEFT JOIN fair_rooms r ON r.queue = c.queue AND r.key = c.fair_key
        ) c JOIN quotas ON quotas.name = c.queue
        WHERE NOT quotas.keyed OR (c.held IS NOT NULL AND c.nth_key <= c.room)
    ) ranked JOIN quotas ON quotas.name = ranked.queue
    WHERE ranked.nth <= quotas.quota
    ORDER BY ranked.priority, ranked.tag NULLS LAST, ranked.run_at
    LIMIT %(limit)s)
),
fair_taken AS MATERIALIZED (
    SELECT r.queue, r.key, r.start, r.weight, count(*) AS n
    FROM chosen JOIN fair_rooms r ON r.queue = chosen.queue AND r.key = chosen.fair_key
    GROUP BY 1, 2, 3, 4
),
-- An UPDATE, not an upsert: a key registered by this very statement (todos_fair_lock_key, fair_register) is
-- not in its snapshot, and an upsert of it would fail ("cannot affect row a second time"); such a key keeps
-- pass 0 and starts at the round at its next claim as well (one turn early, once).
fair_state AS (
    UPDATE todos_fairkey k SET vtime = ft.start + ft.n / ft.weight
    FROM fair_taken ft WHERE k.queue = ft.queue AND k.key = ft.key
),
fair_round AS (
    UPDATE todos_queue q SET fair_round = r.round
    FROM (SELECT queue, min(start) AS round FROM fair_taken GROUP BY queue) r
    WHERE q.name = r.queue AND r.round >= q.fair_round + 1
),
-- The 8 lowest keys below the round, those of them with nothing pending (checked on these 8 only: a scan
-- that went on until it found 8 idle keys would pass every busy key below the round).
fair_idle AS MATERIALIZED (
    SELECT k.queue, k.key FROM (SELECT name, fair_round FROM queues WHERE keyed) q CROSS JOIN LATERAL (
        SELECT k.queue, k.key FROM todos_fairkey k
        WHERE k.queue = q.name AND k.vtime <= q.fair_round
        ORDER BY k.vtime, k.key
        LIMIT 8
    ) k
    WHERE NOT EXISTS (SELECT FROM fair_rooms r WHERE r.queue = k.queue AND r.key = k.key)
      AND NOT EXISTS (SELECT FROM todos_todo t WHERE t.queue = k.queue AND t.fair_key = k.key AND {S.PENDING.sql("t")})
),
fair_pruned AS (
    DELETE FROM todos_fairkey k
    WHERE (k.queue, k.key) IN (
        SELECT l.queue, l.key FROM todos_fairkey l JOIN fair_idle i ON l.queue = i.queue AND l.key = i.key
        FOR UPDATE OF l SKIP LOCKED
    ) AND NOT todos_fair_key_pending(k.queue, k.key)
),
{_bucket("SELECT queue, count(*) AS n FROM chosen GROUP BY queue")}
UPDATE todos_todo t SET {_CLAIM_SET}
WHERE t.id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING {_RETURNING_T}
"""

# claim: this one todo, if the caller may claim from its queue, it is claimable, and its queue's
# controls let one more through (the same _queue_quotas as claim_next); on a queue with
# max_claimed_per_key, its key too, locked as claim_next locks keys (waiting for a claimer holding it). A
# concurrent claim of the same row waits for the first and then re-checks the guard, so only one wins. A
# claim by id is outside the round robin: it does not move the key's pass.
_ITS_QUEUE = "q.name = (SELECT queue FROM todos_todo WHERE id = %(id)s) AND q.name LIKE ANY(%(scopes)s::text[])"
CLAIM_ONE = f"""
WITH {_queue_quotas(_ITS_QUEUE)},
its_key AS MATERIALIZED (
    SELECT t.fair_key FROM todos_todo t JOIN queues q ON q.name = t.queue
    WHERE t.id = %(id)s AND (q.key_cap IS NULL OR EXISTS (
        SELECT FROM todos_fair_lock_key(t.queue, t.fair_key, q.key_cap, true)))
),
claimed AS (
    UPDATE todos_todo t SET {_CLAIM_SET}
    WHERE t.id = %(id)s AND t.queue IN (SELECT name FROM quotas WHERE quota > 0) AND {_CLAIMABLE}
      AND EXISTS (SELECT FROM its_key)
    RETURNING {_RETURNING_T}
),
{_bucket("SELECT queue, count(*) AS n FROM claimed GROUP BY queue")}
SELECT * FROM claimed
"""

# heartbeat: extend the lease. With the current receipt this also takes back a lapsed todo that was
# not re-claimed meanwhile (state claimed again; attempt unchanged: it is the same receive), but not one
# the reaper dead-lettered at its cap: only an operator revives a dead-letter (SPEC decision 1).
# Such a revival makes one more live lease in its queue, so it obeys the queue's controls as a claim
# does: never in a paused queue, never past max_claimed (counted by todos_live_leases() under the
# queue row's lock, as _queue_quotas counts). Rate limits meter new work handed out; a revival hands
# out none (the same receive, the same attempt), so it takes no token. Refused, it changes nothing:
# queue.heartbeat answers 409 with the reason. A live lease's heartbeat reads no queue row.
_REVIVED_QUEUE = f"""(SELECT r.queue FROM todos_todo r
    WHERE r.id = %(id)s AND r.lease_id = %(lease_id)s AND NOT ({S.LIVE_LEASE.sql("r")}))"""
# Progress and checkpoint (NULL: not sent, keep the last) are written only under the receipt, so a
# stale worker can never overwrite the current attempt's.
HEARTBEAT = f"""
WITH revival AS MATERIALIZED (
    SELECT q.name, q.paused, q.max_claimed, q.max_claimed_per_key FROM todos_queue q WHERE q.name = {_REVIVED_QUEUE}
    FOR UPDATE OF q
),
-- max_claimed_per_key too (issue 22): the key is locked as a claim by id locks it (todos_fair_lock_key).
may_revive AS MATERIALIZED (
    SELECT NOT paused AND (max_claimed IS NULL OR todos_live_leases(name) < max_claimed)
        AND (max_claimed_per_key IS NULL OR EXISTS (SELECT FROM todos_fair_lock_key(
            name, (SELECT fair_key FROM todos_todo WHERE id = %(id)s), max_claimed_per_key, true))) AS ok
    FROM revival
)
UPDATE todos_todo SET
    state = 'claimed',
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    next_retry_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress),
    checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint),
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND (({S.LIVE_LEASE.sql()})
    OR (({(S.CLAIMED | S.PENDING).sql()}) AND COALESCE((SELECT ok FROM may_revive), false)))
RETURNING {_TODO_COLUMNS}
"""

# The states a receipt's holder may finish from: all but done. A todo the reaper requeued (pending) or
# dead-lettered at its cap (failed) keeps the lapsed receipt until someone else claims it.
_UNFINISHED = S.CLAIMED | S.PENDING | S.FAILED

# complete: -> done.
COMPLETE = _finishing(
    f"""
UPDATE todos_todo SET
    state = 'done',
    result = %(result)s,
    completed_at = now(),
    updated_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL
WHERE {_HOLDS_RECEIPT} AND {_UNFINISHED.sql()}
RETURNING {_TODO_COLUMNS}
""",
    finished="true",
)

# complete many: one statement for a batch of (id, lease_id, result); rows that come back were completed.
COMPLETE_MANY = _finishing(
    f"""
UPDATE todos_todo t SET
    state = 'done',
    result = items.result,
    completed_at = now(),
    updated_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL
FROM unnest(%(ids)s::text[], %(lease_ids)s::text[], %(results)s::jsonb[]) AS items(id, lease_id, result)
WHERE t.id = items.id AND t.lease_id = items.lease_id AND split_part(t.owner, '/', 1) = %(agent)s
  AND t.queue LIKE ANY(%(visible)s::text[]) AND {_UNFINISHED.sql("t")}
RETURNING {", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))}
""",
    finished="true",
)

# fail: -> failed (notifies when the retry is due at once, e.g. retry_in 0). Below the cap a retry is
# scheduled: after %(retry_in)s seconds if the caller gave it, else exponential backoff with full
# jitter, random() * min(cap, base * 2^(attempt-1)). At the cap next_retry_at stays NULL: a
# dead-letter (SPEC decision 4).
FAIL = _finishing(
    f"""
UPDATE todos_todo t SET
    state = 'failed',
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', %(error)s::text)),
    next_retry_at = CASE WHEN {S.BELOW_CAP.sql("t")} THEN now() + make_interval(secs => COALESCE(
        %(retry_in)s::double precision,
        random() * LEAST(%(backoff_cap)s::double precision,
                         %(backoff_base)s::double precision * power(2, GREATEST(t.attempt, 1) - 1))))
        END,
    lease_id = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND {_UNFINISHED.sql("t")}
RETURNING {_TODO_COLUMNS}
""",
    finished="c.state = 'failed' AND c.next_retry_at IS NULL",
    notify_when=S.RETRY_DUE.sql(),
)

# Owner and claimed_at are the last claim's ("last claimed by"): set by every claim and left alone by
# every other transition (release, lapse, fail, complete, operator steps), so a released and a lapsed
# todo look alike. Only the receipt (lease_id) says whether a claim is still held.

# release: -> pending, handing the attempt back (a voluntary release costs no retry budget). Not from
# a dead-letter: handing back a lease the reaper dead-lettered at its cap would make it claimable again.
# Notifies.
RELEASE = _notifying(f"""
UPDATE todos_todo SET
    state = 'pending',
    attempt = GREATEST(attempt - 1, 0),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND {(S.CLAIMED | S.PENDING).sql()}
RETURNING {_TODO_COLUMNS}
""")

# retry_dead_letter (operator): dead-letter -> pending, with a new budget (reset) or one more try (once).
# Notifies.
RETRY_DEAD_LETTER = _notifying(f"""
UPDATE todos_todo t SET
    state = 'pending',
    attempt = CASE WHEN %(mode)s = 'reset' THEN 0 ELSE t.attempt END,
    max_attempts = CASE WHEN %(mode)s = 'once' THEN GREATEST(t.max_attempts, t.attempt + 1) ELSE t.max_attempts END,
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator retry',
        'operator', %(operator)s::text, 'mode', %(mode)s::text, 'note', %(note)s::text)),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = %(id)s AND {S.DEAD_LETTER.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
""")

# requeue_lapsed (reaper): a batch of lapsed leases -> pending below the cap, dead-letter at it.
# Notifies the queues of the requeued ones.
# SKIP LOCKED lets several reapers (and claimers) share the work without waiting or double-handling.
REQUEUE_LAPSED = _finishing(
    f"""
WITH lapsed AS MATERIALIZED (
    SELECT id FROM todos_todo
    WHERE {S.LEASE_LAPSED.sql()}
    ORDER BY lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE todos_todo t SET
    state = CASE WHEN {S.BELOW_CAP.sql("t")} THEN 'pending' ELSE 'failed' END,
    errors = t.errors || {_LEASE_EXPIRED_ERROR},
    next_retry_at = NULL,
    updated_at = now()
FROM lapsed
WHERE t.id = lapsed.id
RETURNING t.id, t.queue, t.state, t.awaited_by
""",
    finished="c.state = 'failed'",
    notify_when=S.PENDING.sql(),
)

# promote_due_retries (retry scheduler): a batch of failed todos whose retry is due -> pending. Notifies
# (a waiting claimer may already have woken at the due time; the notify covers waiters that started later).
PROMOTE_DUE_RETRIES = _notifying(f"""
WITH due AS MATERIALIZED (
    SELECT id FROM todos_todo
    WHERE {S.RETRY_DUE.sql()}
    ORDER BY next_retry_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE todos_todo t SET state = 'pending', next_retry_at = NULL, updated_at = now()
FROM due
WHERE t.id = due.id
RETURNING t.id, t.queue
""")

# promote_due_scheduled (reaper): a batch of scheduled todos whose run_at has come -> pending, so that
# states read truthfully (claims take due ones without it). Guard: SCHEDULED_DUE; locks: SKIP LOCKED, shared
# with other reapers and claimers; index: todo_scheduled_due, one range per registered queue (the registry
# is small), never reaching future rows. Notifies the queues: a waiter may already have woken at run_at,
# the notify covers waits that started later.
PROMOTE_DUE_SCHEDULED = _notifying(f"""
WITH due AS MATERIALIZED (
    SELECT d.id FROM todos_queue q CROSS JOIN LATERAL (
        SELECT t.id, t.run_at FROM todos_todo t
        WHERE {S.SCHEDULED_DUE.sql("t")} AND t.queue = q.name
        ORDER BY t.run_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ) d
    LIMIT %(batch)s
)
UPDATE todos_todo t SET state = 'pending', updated_at = now()
FROM due
WHERE t.id = due.id
RETURNING t.id, t.queue
""")

# Classifies a guarded UPDATE that touched no row: absent or invisible -> not found, else conflict (a
# claim refused by its queue's controls says so).
CURRENT_STATE = f"""
SELECT t.state, {S.DEAD_LETTER.sql("t")} AS dead_letter, t.lease_id, split_part(t.owner, '/', 1) AS owner_agent,
    q.paused, (q.max_claimed IS NOT NULL OR q.rate_per_second IS NOT NULL) AS limited
FROM todos_todo t LEFT JOIN todos_queue q ON q.name = t.queue
WHERE t.id = %(id)s AND t.queue LIKE ANY(%(visible)s::text[])
"""

# --- Operator transitions (the admin's actions). Each names the operator in errors or result. -------
# Each takes a list of ids (%(ids)s) so the admin's bulk runs make one statement per batch; the
# single-todo functions pass a list of one. The guard applies to each row on its own: rows that do
# not pass it are left alone and simply not returned.

# retry_now (operator): retry-waiting -> pending at once, as promote_due_retries would do when the retry
# falls due. Straight to pending (not next_retry_at = now()) so the operator sees the effect on the
# next page load instead of after the reaper's next sweep. Recorded in errors, like operator retry.
# Notifies, waking long-polls of the queue.
RETRY_NOW = _notifying(
    f"""
UPDATE todos_todo t SET
    state = 'pending',
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator retry now', 'operator', %(operator)s::text)),
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {S.RETRY_WAITING.sql("t")}
  AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
)

# discard (operator): pending, scheduled or failed (retry-waiting or dead) -> done, the result saying who
# and why.
# Never from claimed: a worker holds it and may be mid-way; the operator force-releases it first.
# done frees the idempotency key, so this can never collide with a newer runnable todo.
DISCARD = _finishing(
    f"""
UPDATE todos_todo t SET
    state = 'done',
    result = jsonb_build_object('discarded_by', %(operator)s::text, 'reason', %(reason)s::text),
    completed_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {(S.PENDING | S.SCHEDULED | S.FAILED).sql("t")}
  AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
""",
    finished="true",
)

# force_release (operator): claimed -> pending whatever the receipt. The attempt stays counted (it was
# a receive, as with a lapse); the old receipt is voided, so the stuck worker gets 409 if it wakes up.
# Notifies, waking long-polls of the queue.
FORCE_RELEASE = _notifying(
    f"""
UPDATE todos_todo t SET
    state = 'pending',
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator force-release',
        'operator', %(operator)s::text, 'owner', t.owner)),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {S.CLAIMED.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
)

# cancel (an agent or operator): pending, scheduled, retry-waiting or claimed -> cancelled, for each id that is
# cancellable (states.CANCELLABLE). A claimed todo's lease is revoked with it: lease_id cleared, so the
# worker's next heartbeat, complete or fail matches no row and is classified as a conflict with state
# cancelled. Who and why go into errors, beside the owner it was taken from. Terminal: frees the
# idempotency key (cancelled is not runnable). Notifies: a cancelled lease frees a slot of a queue with
# max_claimed (cancels are rare; the few needless wakes cost nothing).
CANCEL = _finishing(
    f"""
UPDATE todos_todo t SET
    state = 'cancelled',
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'cancelled', 'cancelled_by', %(operator)s::text,
        'reason', %(reason)s::text, 'was', t.state, 'owner', t.owner)),
    completed_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {S.CANCELLABLE.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
""",
    finished="true",
    notify_when="true",
)

# retry_dead_letter_many (operator): RETRY_DEAD_LETTER for a batch of ids.
RETRY_DEAD_LETTER_MANY = RETRY_DEAD_LETTER.replace("t.id = %(id)s", "t.id = ANY(%(ids)s::text[])")

# run_now (operator): scheduled -> pending at once, run_at = now() (its place in claim order is now, behind
# what was already waiting at its priority). Guard: state scheduled, in the operator's scopes; lock: the
# rows updated, for this one statement. Recorded in errors, like retry now. Notifies.
RUN_NOW = _notifying(
    f"""
UPDATE todos_todo t SET
    state = 'pending',
    run_at = now(),
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator run now', 'operator', %(operator)s::text)),
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {S.SCHEDULED.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
)

# set_priority (operator): a pending or scheduled todo's priority. Guard: one of those states, in the
# operator's scopes (a claimed one is being worked on: its priority no longer means anything); lock: the
# rows updated. Not recorded in errors (the admin's log records it); no notify: nothing new is claimable.
SET_PRIORITY = f"""
UPDATE todos_todo t SET priority = %(priority)s, updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {S.PRIORITY_CHANGEABLE.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""


# --- Reads -----------------------------------------------------------------------------------------

# queue_stats (todos/selectors.py; feeds GET /api/v1/queues/, the admin dashboard and /metrics): per
# queue the caller may see, from the small registry (so an empty queue reports zeros), one grouped
# aggregate per live state, each read from its partial index: pending from todo_pending_claim_scan (an
# index-only scan that also yields the oldest run_at, when the longest-waiting todo became claimable),
# claimed from todo_claimed_lease_expiry, retry-waiting from todo_retry_queue_due (per queue: the
# global todo_retry_due would walk every queue's retries), dead-letters from
# todo_dead_letters, scheduled from todo_scheduled_due, cancelled from todo_cancelled_recent (index-only;
# retention keeps it short), waiting from todo_waiting (index-only). Done todos are history and are not
# counted: that would scan it. Also each queue's controls. Measured at 1M rows in docs/benchmarks.md ("Operations").
QUEUE_STATS = f"""
WITH q AS (SELECT name FROM todos_queue WHERE name LIKE ANY(%(visible)s::text[])),
pending AS (
    SELECT queue, count(*) AS n, min(run_at) AS oldest FROM todos_todo
    WHERE {S.PENDING.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
claimed AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.CLAIMED.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
retrying AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.RETRY_WAITING.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
dead AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.DEAD_LETTER.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
scheduled AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.SCHEDULED.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
cancelled AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.CANCELLED.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
waiting AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.WAITING.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
)
SELECT q.name, COALESCE(pending.n, 0), COALESCE(claimed.n, 0), COALESCE(retrying.n, 0), COALESCE(dead.n, 0),
    pending.oldest, EXTRACT(EPOCH FROM now() - pending.oldest)::double precision, COALESCE(scheduled.n, 0),
    COALESCE(cancelled.n, 0), r.paused, r.max_claimed, r.rate_per_second, r.rate_burst, COALESCE(waiting.n, 0)
FROM q
JOIN todos_queue r ON r.name = q.name
LEFT JOIN pending ON pending.queue = q.name
LEFT JOIN claimed ON claimed.queue = q.name
LEFT JOIN retrying ON retrying.queue = q.name
LEFT JOIN dead ON dead.queue = q.name
LEFT JOIN scheduled ON scheduled.queue = q.name
LEFT JOIN cancelled ON cancelled.queue = q.name
LEFT JOIN waiting ON waiting.queue = q.name
ORDER BY q.name
"""

# seconds_until_claimable (the long-poll, todos/waiting.py): seconds (by the database's clock) until the
# earliest lease in the caller's queues lapses, the earliest scheduled retry comes due, or the earliest
# scheduled todo's run_at comes: work that becomes claimable with no write and so no NOTIFY. Negative
# when such work is claimable already; NULL when there is none. Same queue set and assignee rule as
# CLAIM_NEXT; paused queues are left out (resume notifies). The scheduled and retry branches are one
# descent per queue of todo_scheduled_due and todo_retry_queue_due (the first entry is that queue's
# earliest run_at or next_retry_at), so a million todos scheduled for later, or other queues' retries,
# cost it nothing; an assignee filter may walk past the other agents' rows. The retry branch orders
# NULLS FIRST (next_retry_at is never null there: the same order), which only todo_retry_queue_due yields,
# as the claim's pending scan does: ordered plainly, the planner walked todo_retry_due's global order,
# expecting its queue's first retry within a few entries, and stepped over every other queue's earlier
# retries (todos/tests/test_read_plans.py). Queue
# controls add two moments, for limited queues with pending work:
#  * a rate-limited one: when its bucket next holds a whole token (tokens refill with no write);
#  * one at its max_claimed: now (0), so the waiter re-polls with backoff (up to
#    waiting.FALLBACK_POLL_SECONDS). A complete or fail that frees a slot does not notify: that would cost
#    every completion of every queue a lookup, and the completing worker usually claims again itself.
SECONDS_UNTIL_CLAIMABLE = f"""
WITH queues AS (
    SELECT name, max_claimed, rate_per_second, rate_burst, tokens, refilled_at FROM todos_queue
    WHERE name LIKE ANY(%(scopes)s::text[]) AND name LIKE ANY(%(wanted)s::text[]) AND NOT paused
),
waiting AS (
    SELECT queues.* FROM queues
    WHERE (max_claimed IS NOT NULL OR rate_per_second IS NOT NULL) AND EXISTS (
        SELECT 1 FROM todos_todo t WHERE {S.PENDING.sql("t")} AND t.queue = queues.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s))
)
SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(t.lease_expires_at) FROM todos_todo t
     WHERE {(S.CLAIMED & S.BELOW_CAP).sql("t")} AND t.queue IN (SELECT name FROM queues)
       AND (t.assignee IS NULL OR t.assignee = %(agent)s)),
    (SELECT min(r.next_retry_at) FROM queues CROSS JOIN LATERAL (
        SELECT t.next_retry_at FROM todos_todo t
        WHERE {S.RETRY_WAITING.sql("t")} AND t.queue = queues.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.next_retry_at NULLS FIRST LIMIT 1
    ) r),
    (SELECT min(s.run_at) FROM queues CROSS JOIN LATERAL (
        SELECT t.run_at FROM todos_todo t
        WHERE {S.SCHEDULED.sql("t")} AND t.queue = queues.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.run_at LIMIT 1
    ) s),
    (SELECT min(w.refilled_at + make_interval(secs => GREATEST(1 - w.tokens, 0) / w.rate_per_second))
     FROM waiting w WHERE w.rate_per_second IS NOT NULL),
    (SELECT min(CASE WHEN todos_live_leases(w.name) >= w.max_claimed THEN now() END)
     FROM waiting w WHERE w.max_claimed IS NOT NULL)
) - now())::double precision
"""

# The dashboard's completions and failures per queue and minute over the last %(minutes)s minutes
# (todos/dashboard.py): range scans of todo_done_recent and todo_failed_recent.
PER_MINUTE = f"""
SELECT queue, 'done' AS what, date_trunc('minute', completed_at) AS minute, count(*) FROM todos_todo
WHERE {S.DONE.sql()} AND completed_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY 1, 3
UNION ALL
SELECT queue, 'failed', date_trunc('minute', updated_at), count(*) FROM todos_todo
WHERE {S.FAILED.sql()} AND updated_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY 1, 3
"""

# --- Retention (todos/retention.py) ----------------------------------------------------------------
# Deleting finished rows is not a transition. Every batch is one short statement that locks at most
# %(batch)s rows with SKIP LOCKED: it never waits for, or holds up, a claim, an operator or another purge.

_DONE_PURGEABLE = f"{S.DONE.sql('t')} AND t.completed_at < now() - make_interval(secs => %(done_age)s)"
_DEAD_PURGEABLE = f"{S.DEAD_LETTER.sql('t')} AND t.updated_at < now() - make_interval(secs => %(dead_age)s)"
_CANCELLED_PURGEABLE = f"{S.CANCELLED.sql('t')} AND t.completed_at < now() - make_interval(secs => %(cancelled_age)s)"


def _purge_batch(purgeable: str, oldest_first: str) -> str:
    """One batch of a retention rule: the oldest rows past their window, locked SKIP LOCKED (a row
    changed a moment ago re-checks the condition under the lock and is left alone), then deleted."""
    return f"""
WITH doomed AS MATERIALIZED (
    SELECT t.id FROM todos_todo t
    WHERE {purgeable}
    ORDER BY {oldest_first}
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM todos_todo t USING doomed WHERE t.id = doomed.id
"""


# Done todos past the window, oldest first: a range scan of todo_done_recent.
PURGE_DONE = _purge_batch(_DONE_PURGEABLE, "t.completed_at")
# Dead-letters past the window: a range scan of todo_failed_recent (retry-waiting rows are filtered
# out). The lock re-checks the row, so one an operator retried a moment ago (no longer dead) is left alone.
PURGE_DEAD = _purge_batch(_DEAD_PURGEABLE, "t.updated_at")
# Cancelled todos past their window, oldest first: a range scan of todo_cancelled_recent.
PURGE_CANCELLED = _purge_batch(_CANCELLED_PURGEABLE, "t.completed_at")

# Events are walked in (received_at, id) order a page at a time, so those that still have todos are
# read once per purge, not once per batch. A page's events without todos are deleted; the NOT EXISTS
# uses the index on todos_todo.event_id. A todo inserted for the event concurrently (a replay) either
# holds a key-share lock on it (SKIP LOCKED passes over the event) or fails its foreign-key check at
# commit: an event is never deleted from under a todo.
EVENT_PAGE = """
SELECT e.id, e.received_at FROM events_event e
WHERE e.received_at < now() - make_interval(secs => %(done_age)s)
  AND (e.received_at, e.id) > (%(after_at)s::timestamptz, %(after_id)s::text)
ORDER BY e.received_at, e.id
LIMIT %(batch)s
"""

PURGE_EVENTS = """
WITH doomed AS MATERIALIZED (
    SELECT e.id FROM events_event e
    WHERE e.id = ANY(%(ids)s::text[])
      AND NOT EXISTS (SELECT 1 FROM todos_todo t WHERE t.event_id = e.id)
    FOR UPDATE SKIP LOCKED
)
DELETE FROM events_event e USING doomed WHERE e.id = doomed.id
"""

# --dry-run: what a purge would delete now, events counted as if the todos had gone first.
COUNT_PURGEABLE = f"""
SELECT
    (SELECT count(*) FROM todos_todo t WHERE {_DONE_PURGEABLE}),
    (SELECT count(*) FROM todos_todo t WHERE {_DEAD_PURGEABLE}),
    (SELECT count(*) FROM events_event e
     WHERE e.received_at < now() - make_interval(secs => %(done_age)s)
       AND NOT EXISTS (SELECT 1 FROM todos_todo t
                       WHERE t.event_id = e.id AND NOT ({_DONE_PURGEABLE}) AND NOT ({_DEAD_PURGEABLE})
                         AND NOT ({_CANCELLED_PURGEABLE}))),
    (SELECT count(*) FROM todos_todo t WHERE {_CANCELLED_PURGEABLE})
"""


# --- Queue controls (todos/controls.py) --------------------------------------------------------------
# Each is one UPDATE of the queue's row in todos_queue, which every claim reads (CLAIM_NEXT's
# _queue_quotas): a change holds for every process from its next claim. A limited queue's row is locked
# by its claims for the length of one claim statement, so a change waits at most that long.

_QUEUE_COLUMNS = "name, paused, max_claimed, rate_per_second, rate_burst, fair, fair_weights, max_claimed_per_key"


# A queue change may make many todos claimable at once, and a notification wakes one waiter per count
# (todos/waiting.py), so it says "<queue> <n>": n the queue's claimable todos, counted up to this many
# (enough for every waiter a process holds at once; a waiter left asleep still wakes when its wait ends).
_QUEUE_WAKES_MAX = 1000


def _notifying_queue(changed: str, also: str = "") -> str:
    """Like _notifying, for todos_queue: wakes as many long-polls of the queue that changed as it has
    claimable todos (at least one, at most _QUEUE_WAKES_MAX). ``also``: more CTEs run beside it."""
    return f"""
WITH changed AS ({changed}),{also}
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', c.name || ' ' || GREATEST(1, (
        SELECT count(*) FROM (
            SELECT 1 FROM todos_todo t WHERE t.queue = c.name AND {S.CLAIMABLE.sql("t")} LIMIT {_QUEUE_WAKES_MAX}
        ) claimable)))
    FROM changed c
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# pause: claims skip the queue from their next statement; creates still land. Leases already held run on.
PAUSE_QUEUE = f"""
UPDATE todos_queue SET paused = true WHERE name = %(name)s AND name LIKE ANY(%(visible)s::text[])
RETURNING {_QUEUE_COLUMNS}
"""

# resume: notifies, so the long-polls waiting on the queue claim at once.
RESUME_QUEUE = _notifying_queue(f"""
UPDATE todos_queue SET paused = false WHERE name = %(name)s AND name LIKE ANY(%(visible)s::text[])
RETURNING {_QUEUE_COLUMNS}
""")

# set limits: each control changes only if given (%(set_*)s), fair share's three (issue 22) too; setting the
# rate or the burst starts the bucket full (a change grants one burst). The burst defaults to one second's
# worth. Notifies: a raised or removed limit may let waiters through.
SET_QUEUE_LIMITS = _notifying_queue(
    """
UPDATE todos_queue q SET
    max_claimed = CASE WHEN %(set_max_claimed)s THEN %(max_claimed)s::integer ELSE q.max_claimed END,
    fair = CASE WHEN %(set_fair)s THEN %(fair)s::boolean ELSE q.fair END,
    fair_weights = CASE WHEN %(set_fair_weights)s THEN %(fair_weights)s::jsonb ELSE q.fair_weights END,
    max_claimed_per_key = CASE WHEN %(set_max_claimed_per_key)s THEN %(max_claimed_per_key)s::integer
        ELSE q.max_claimed_per_key END,
    rate_per_second = want.rate,
    rate_burst = want.burst,
    tokens = CASE WHEN want.rate IS NULL THEN NULL WHEN %(set_rate)s OR %(set_burst)s OR q.tokens IS NULL
        THEN want.burst ELSE q.tokens END,
    refilled_at = CASE WHEN want.rate IS NULL THEN NULL WHEN %(set_rate)s OR %(set_burst)s OR q.tokens IS NULL
        THEN now() ELSE q.refilled_at END
FROM todos_queue cur CROSS JOIN LATERAL (
    SELECT r.rate, CASE WHEN r.rate IS NULL THEN NULL ELSE COALESCE(
        CASE WHEN %(set_burst)s THEN %(rate_burst)s::integer ELSE cur.rate_burst END,
        GREATEST(1, ceil(r.rate))::integer) END AS burst
    FROM (SELECT CASE WHEN %(set_rate)s THEN %(rate_per_second)s::double precision ELSE cur.rate_per_second END
          AS rate) r
) want
WHERE q.name = %(name)s AND cur.name = q.name AND q.name LIKE ANY(%(visible)s::text[])
RETURNING q.name, q.paused, q.max_claimed, q.rate_per_second, q.rate_burst, q.fair, q.fair_weights,
    q.max_claimed_per_key
""",
    # A queue that becomes keyed registers the keys of its pending todos (the todo table's triggers register
    # the keys of those to come, todos/migrations/0016). The claim also registers the key at its queue's head,
    # so one whose create committed while this ran is served all the same.
    also=f"""
registered AS (
    INSERT INTO todos_fairkey (queue, key, vtime)
    SELECT DISTINCT t.queue, t.fair_key, 0 FROM changed c JOIN todos_todo t ON t.queue = c.name
    WHERE (c.fair OR c.max_claimed_per_key IS NOT NULL) AND {S.PENDING.sql("t")}
    ON CONFLICT DO NOTHING
),""",
)

# One queue's controls (the API's answers, and a miss: absent or out of scope is not found).
QUEUE_CONTROLS = f"""
SELECT {_QUEUE_COLUMNS} FROM todos_queue WHERE name = %(name)s AND name LIKE ANY(%(visible)s::text[])
"""


# --- Waits (issue 20): the waiting state and its waitpoints (todos/waitpoints.py) ------------------
# A todo waits with an open row in todos_waitpoint (resolved_at NULL). Every way out of waiting closes
# that row and moves the todo in ONE statement: the row's lock decides the race, so of two resolvers (two
# token resolves, a resolve and the timeout, two deliveries) exactly one closes it and moves the todo;
# the other finds resolved_at set when it re-reads the locked row and changes nothing.

# wait (the holder): claimed (or pending with its lapsed receipt, as release) -> waiting, giving the
# lease and the attempt back, and opens its waitpoint (a new wait replaces the todo's last one). Guard:
# the receipt; lock: the row. A wait on todos then runs ATTACH_AWAITED in the same transaction.
WAIT = f"""
WITH changed AS (
    UPDATE todos_todo t SET
        state = '{S.TodoState.WAITING}',
        attempt = GREATEST(t.attempt - 1, 0),
        lease_id = NULL,
        lease_expires_at = NULL,
        next_retry_at = NULL,
        waiting_for = %(waiting_for)s,
        resolution = NULL,
        awaited_left = NULL,
        errors = t.errors || jsonb_build_array(jsonb_build_object(
            'attempt', t.attempt, 'at', now(), 'error', 'waiting', 'for', %(waiting_for)s::jsonb,
            'timeout_seconds', %(timeout)s::double precision, 'on_timeout', %(on_timeout)s::text)),
        updated_at = now()
    WHERE {_HOLDS_RECEIPT} AND {(S.CLAIMED | S.PENDING).sql("t")}
    RETURNING {_RETURNING_T}
),
opened AS (
    INSERT INTO todos_waitpoint (todo_id, queue, created_at, timeout_at, on_timeout, token_hash, event_source,
        event_type_like, event_match, event_key, resolved_at)
    SELECT id, queue, now(), now() + make_interval(secs => %(timeout)s), %(on_timeout)s, %(hash)s,
        %(source)s, %(type_like)s, %(match)s, %(key)s, NULL
    FROM changed
    ON CONFLICT (todo_id) DO UPDATE SET queue = EXCLUDED.queue, created_at = EXCLUDED.created_at,
        timeout_at = EXCLUDED.timeout_at, on_timeout = EXCLUDED.on_timeout, token_hash = EXCLUDED.token_hash,
        event_source = EXCLUDED.event_source, event_type_like = EXCLUDED.event_type_like,
        event_match = EXCLUDED.event_match, event_key = EXCLUDED.event_key, resolved_at = NULL
)
SELECT * FROM changed
"""

# The awaited todos a caller may see, and whether each has finished (a wait on todos, before WAIT).
AWAITED = f"""
SELECT t.id, {FINISHED.sql("t")} FROM todos_todo t
WHERE t.id = ANY(%(ids)s::text[]) AND t.queue LIKE ANY(%(visible)s::text[])
"""


def _resolving(hit: str, by: str, detail: str, guard: str = "true") -> str:
    """Close waitpoints (``hit``: an UPDATE of todos_waitpoint RETURNING todo_id, resolved_at) and move
    their todos, still waiting, to pending; notifies their queues; returns the todos."""
    return f"""
WITH hit AS ({hit}),
changed AS (
    UPDATE todos_todo t SET {_resolved_set(by, detail)}
    FROM hit
    WHERE t.id = hit.todo_id AND hit.resolved_at IS NOT NULL AND {S.WAITING.sql("t")} AND {guard}
    RETURNING {_RETURNING_T}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM changed WHERE {S.PENDING.sql()} GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# attach (queue.wait on todos, after WAIT in the same transaction): each awaited todo not finished gets the
# waiter in its awaited_by (once), and the waiter's awaited_left lists those; none: resolved at once.
# Updating the awaited rows is what makes a finishing statement and this one meet on the same row:
# a todo finishing meanwhile is waited for and then, re-read, left out (see _finishing).
ATTACH_AWAITED = f"""
WITH kids AS (
    UPDATE todos_todo k SET awaited_by = CASE WHEN %(id)s::text = ANY(k.awaited_by) THEN k.awaited_by
        ELSE array_append(COALESCE(k.awaited_by, '{{}}'), %(id)s::varchar(40)) END
    WHERE k.id = ANY(%(ids)s::text[]) AND NOT ({FINISHED.sql("k")})
    RETURNING k.id
),
changed AS (
    UPDATE todos_todo t SET
        awaited_left = n.left,
        {_resolved_set("'todos'", "jsonb_build_object('todos', t.waiting_for->'todos')", when="n.left = '{{}}'")}
    FROM (SELECT COALESCE(array_agg(id), '{{}}')::varchar(40)[] AS left FROM kids) n
    WHERE t.id = %(id)s AND {S.WAITING.sql("t")}
    RETURNING {_RETURNING_T}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM changed WHERE {S.PENDING.sql()}
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""

# resolve_token: the waitpoint whose token hashes to %(hash)s (unique index). No other credential:
# the token is the credential. Resolves once; a second finds it closed.
RESOLVE_TOKEN = _resolving(
    """
    UPDATE todos_waitpoint w SET resolved_at = now()
    WHERE w.token_hash = %(hash)s AND w.resolved_at IS NULL
    RETURNING w.todo_id, w.resolved_at""",
    "'token'",
    "jsonb_build_object('data', %(data)s::jsonb)",
)

# A token's waitpoint, open or closed (telling a second resolve, 409, from an unknown token, 404).
WAITPOINT_BY_HASH = "SELECT todo_id, resolved_at FROM todos_waitpoint WHERE token_hash = %(hash)s"

# resolve (an agent whose scopes cover the queue, or an operator): any open wait of this todo. %(by)s
# names who; %(detail)s the data (and an operator's verdict and note).
RESOLVE_MANUAL = _resolving(
    """
    UPDATE todos_waitpoint w SET resolved_at = now()
    WHERE w.todo_id = %(id)s AND w.resolved_at IS NULL AND w.queue LIKE ANY(%(visible)s::text[])
    RETURNING w.todo_id, w.resolved_at""",
    "%(by)s::text",
    "%(detail)s::jsonb",
)

# resolve_events (in the ingest transaction that stores the event): the open waits indexed under one of
# the delivery's keys (waitpoint_event_key, one probe per key), of its source, begun before it arrived,
# whose type glob and whole match hold. The event's id and payload go into each resolution.
RESOLVE_EVENTS = _resolving(
    """
    UPDATE todos_waitpoint w SET resolved_at = now()
    WHERE w.event_key = ANY(%(keys)s::text[]) AND w.resolved_at IS NULL AND w.event_source = %(source)s
      AND %(type)s::text LIKE w.event_type_like AND %(payload)s::jsonb @> w.event_match
      AND w.created_at <= %(received_at)s::timestamptz
    RETURNING w.todo_id, w.resolved_at""",
    "'event'",
    """jsonb_build_object('event', jsonb_build_object('id', %(event_id)s::text, 'source', %(source)s::text,
        'type', %(type)s::text, 'payload', %(payload)s::jsonb))""",
)

# time_out_waits (reaper): a batch of open waits past their timeout, oldest first, SKIP LOCKED (shared with
# other reapers; a resolver holding one wins, and this one skips it). on_timeout pending: runnable again,
# resolution timed_out. fail: a failure that counts toward the attempts (the wait gave its attempt back),
# with FAIL's backoff below the cap and a dead-letter at it, which finishes the todo for its own waiters.
TIME_OUT_WAITS = _finishing(
    f"""
    UPDATE todos_todo t SET
        state = CASE WHEN closed.on_timeout = 'fail' THEN '{S.TodoState.FAILED}' ELSE '{S.TodoState.PENDING}' END,
        attempt = CASE WHEN closed.on_timeout = 'fail' THEN t.attempt + 1 ELSE t.attempt END,
        next_retry_at = CASE WHEN closed.on_timeout = 'fail' AND t.attempt + 1 < t.max_attempts
            THEN now() + make_interval(secs => random() * LEAST(%(backoff_cap)s::double precision,
                %(backoff_base)s::double precision * power(2, t.attempt)))
            END,
        waiting_for = NULL,
        resolution = jsonb_build_object('by', 'timeout', 'at', now(), 'timed_out', true),
        errors = t.errors || jsonb_build_array(jsonb_build_object(
            'attempt', t.attempt + CASE WHEN closed.on_timeout = 'fail' THEN 1 ELSE 0 END, 'at', now(),
            'error', 'wait timed out', 'on_timeout', closed.on_timeout)),
        updated_at = now()
    FROM closed
    WHERE t.id = closed.todo_id AND {S.WAITING.sql("t")}
    RETURNING t.id, t.queue, t.state, t.next_retry_at, t.awaited_by""",
    finished=f"{S.FAILED.sql('c')} AND c.next_retry_at IS NULL",
    notify_when=S.PENDING.sql(),
    before="""due AS MATERIALIZED (
    SELECT todo_id FROM todos_waitpoint
    WHERE resolved_at IS NULL AND timeout_at <= now()
    ORDER BY timeout_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
closed AS (
    UPDATE todos_waitpoint w SET resolved_at = now() FROM due WHERE w.todo_id = due.todo_id
    RETURNING w.todo_id, w.on_timeout
),
""",
)
