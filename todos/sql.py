"""Every hand-written statement of the queue, named for its transition (procrastinate and river keep
theirs the same way). Each is ONE statement: the guard sits in the WHERE clause, times come from the
database's now() (SPEC decision 7), and RETURNING hands back the row as it is after the change.

Why raw SQL here and the ORM elsewhere: the claim scan needs one index lookup per queue (a LATERAL
join, SPEC trap 1) and every transition must be a single guarded UPDATE ... RETURNING (trap 2);
Django's ORM can express neither. bench/queue_throughput.py measures the result against the same
cycle written directly against psycopg.

Parameters common to several statements:
  visible   LIKE patterns of the queues the caller may see (its scopes; ['%'] for the system)
  agent     the agent's name; a claim's owner is "<agent>" or "<agent>/<worker>"
"""

# --- Scheduling vocabulary (issue 12). Fold into the vocabulary module (todos/states.py) at merge; the
# statements below use these names, never the conditions written out. Python forms: todos/models.py's
# block of the same name. Written for a todos_todo aliased t.
# scheduled and due: claimable by the claim scan at once (like a lapsed lease, SPEC decision 1), promoted
# to pending by the reaper. Served by todo_scheduled_due (queue, run_at) WHERE state = 'scheduled'.
SCHEDULED_DUE = "t.state = 'scheduled' AND t.run_at <= now()"
# Claim order, everywhere a claim chooses: priority first (lower first), then time (run_at: creation time
# unless scheduled). created_at would do for time only while nothing is scheduled.
CLAIM_ORDER = "priority, run_at"
# create: a run_at in the future makes a scheduled todo; otherwise pending. %(run_at)s is the caller's
# run_at, or NULL for now() + %(delay)s seconds (NULL: none).
_RUN_AT = "COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => COALESCE(%(delay)s::double precision, 0)))"
_CREATED_STATE = f"CASE WHEN {_RUN_AT} > now() THEN 'scheduled' ELSE 'pending' END"
# A scheduled create wakes the long-polls of its queue only when it falls due within the longest wait
# (todos/api/serializers.py MAX_WAIT_SECONDS): a waiter then re-reads its next wake time
# (todos/selectors.py SECONDS_UNTIL_CLAIMABLE) and wakes at run_at. Later ones are found by the waits
# that start after them; NOTIFYing those would wake waiters for nothing.
SCHEDULED_NOTIFY_HORIZON_SECONDS = 20
# Also the unique constraint todo_runnable_idempotency_key's condition (todos/models.py RUNNABLE); ON
# CONFLICT must repeat it for PostgreSQL to pick that partial index as the arbiter.
_RUNNABLE_KEY = """idempotency_key IS NOT NULL
    AND (state IN ('pending', 'claimed', 'scheduled') OR (state = 'failed' AND next_retry_at IS NOT NULL))"""
# --- end of the scheduling vocabulary

_TODO_COLUMNS = """id, queue, source, kind, title, payload, event_id, idempotency_key, assignee, state, owner,
    lease_expires_at, attempt, max_attempts, result, created_at, updated_at, claimed_at, completed_at,
    next_retry_at, lease_id, errors, run_at, priority"""
# Every statement that hands back todos returns these columns, in this order: todos/queue.py builds
# Todos from them and bench/queue_throughput.py reads them by position.
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
# their own statement (no extra round trip); todos/listen.py wakes the long-polling claims of that
# queue. A NOTIFY is delivered when the transaction commits, so a woken claimer sees the row, and
# PostgreSQL folds identical (channel, payload) pairs of one transaction into one.
NOTIFY_CHANNEL = "switchboard_todos"


def _notifying(changed: str, when: str = "true") -> str:
    """Wrap a data-modifying statement (``changed``, with RETURNING queue, ...) so that it also
    notifies each distinct queue of the rows that satisfy ``when``; it returns the same rows."""
    return f"""
WITH changed AS ({changed}),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM (SELECT DISTINCT queue FROM changed WHERE {when}) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# create: -> pending, or -> scheduled when run_at is in the future. A row comes back only if it was
# inserted; none means a runnable todo with the same (queue, idempotency_key) exists (read it with
# RUNNABLE_BY_KEY). The queue's name is registered in the same statement, so a claimer can never see the
# todo before it can see its queue. Guard: the runnable-key arbiter; no lock beyond the insert's own.
CREATE = f"""
WITH registered AS (
    INSERT INTO todos_queue (name, created_at) VALUES (%(queue)s, now()) ON CONFLICT (name) DO NOTHING
),
inserted AS (
INSERT INTO todos_todo (id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
    state, attempt, max_attempts, errors, created_at, updated_at, run_at, priority)
VALUES (%(id)s, %(queue)s, %(source)s, %(kind)s, %(title)s, %(payload)s, %(event_id)s, %(idempotency_key)s,
    %(assignee)s, {_CREATED_STATE}, 0, %(max_attempts)s, '[]'::jsonb, now(), now(), {_RUN_AT}, %(priority)s)
ON CONFLICT (queue, idempotency_key) WHERE {_RUNNABLE_KEY} DO NOTHING
RETURNING {_TODO_COLUMNS}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM inserted
    WHERE state = 'pending' OR run_at <= now() + make_interval(secs => {SCHEDULED_NOTIFY_HORIZON_SECONDS})
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
_CLAIMABLE = f"""(t.assignee IS NULL OR t.assignee = %(agent)s) AND (
    t.state = 'pending'
    OR (t.state = 'claimed' AND t.lease_expires_at < now() AND t.attempt < t.max_attempts)
    OR (t.state = 'failed' AND t.next_retry_at <= now())
    OR ({SCHEDULED_DUE}))"""

_CLAIM_SET = """
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
    errors = CASE WHEN t.state = 'claimed' THEN t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', t.lease_expires_at, 'error', 'lease expired', 'reclaimed_at', now()))
        ELSE t.errors END"""

# claim_next: up to %(limit)s todos in claim order (CLAIM_ORDER: priority, then run_at), from the
# caller's queues. Guard: _CLAIMABLE's cases, one branch each; locks: FOR UPDATE SKIP LOCKED per branch.
#  * Scope globs become concrete names through the small todos_queue table; then each queue's pending
#    rows are read by one descent of todo_pending_claim_scan (queue, priority, run_at) in claim order (a
#    LATERAL join), never by sorting every pending row (SPEC trap 1). Priority therefore holds within and
#    across the caller's queues, and for batch claims.
#  * Due scheduled todos come from todo_scheduled_due, also one descent per queue: the range
#    run_at <= now() ends at the first future row, so 1M todos scheduled for later cost a claim nothing.
#  * Lapsed leases and due retries are few (the reaper keeps them so); they come from their own
#    partial indexes in expiry/due order.
#  * The branches other than pending are taken in time order and their rows compete with pending ones in
#    claim order: until the reaper moves them to pending (within a sweep), a more urgent one further down
#    such a branch may wait behind a less urgent one above it; taking them by priority would mean sorting
#    the whole branch on every claim.
#  * Every branch locks with SKIP LOCKED, so concurrent claimers never wait for or share a row. The
#    CTEs are MATERIALIZED and the UPDATE joins the chosen ids, so the locking scans run exactly once
#    and never take more than %(limit)s rows (a WHERE id IN (subquery) may be re-run by the planner).
#  * A branch may lock up to %(limit)s rows per queue that the final LIMIT does not take; those locks
#    end with this statement's transaction, a millisecond later.
CLAIM_NEXT = f"""
WITH queues AS (
    SELECT name FROM todos_queue
    WHERE name LIKE ANY(%(scopes)s::text[]) AND name LIKE ANY(%(wanted)s::text[])
),
pending AS MATERIALIZED (
    SELECT p.id, p.priority, p.run_at FROM queues CROSS JOIN LATERAL (
        SELECT t.id, t.priority, t.run_at FROM todos_todo t
        WHERE t.state = 'pending' AND t.queue = queues.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        -- NULLS FIRST (run_at is never null, so the order is the same) matches only todo_pending_claim_scan,
        -- so no other index can ever serve this order: the planner once served the claim from the admin's
        -- created_at index and walked the done history at its head on every claim (migration 0007: in a
        -- 45 s soak, 10,000 buffers a claim, throughput down by two thirds).
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) p
),
scheduled AS MATERIALIZED (
    SELECT s.id, s.priority, s.run_at FROM queues CROSS JOIN LATERAL (
        SELECT t.id, t.priority, t.run_at FROM todos_todo t
        WHERE {SCHEDULED_DUE} AND t.queue = queues.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) s
),
lapsed AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at FROM todos_todo t
    WHERE t.state = 'claimed' AND t.lease_expires_at < now() AND t.attempt < t.max_attempts
      AND t.queue IN (SELECT name FROM queues) AND (t.assignee IS NULL OR t.assignee = %(agent)s)
    ORDER BY t.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
due AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at FROM todos_todo t
    WHERE t.state = 'failed' AND t.next_retry_at IS NOT NULL AND t.next_retry_at <= now()
      AND t.queue IN (SELECT name FROM queues) AND (t.assignee IS NULL OR t.assignee = %(agent)s)
    ORDER BY t.next_retry_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
chosen AS MATERIALIZED (
    SELECT id FROM (
        SELECT * FROM pending UNION ALL SELECT * FROM scheduled
        UNION ALL SELECT * FROM lapsed UNION ALL SELECT * FROM due
    ) candidates
    ORDER BY {CLAIM_ORDER}
    LIMIT %(limit)s
)
UPDATE todos_todo t SET {_CLAIM_SET}
FROM chosen
WHERE t.id = chosen.id
RETURNING {", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))}
"""

# claim: this one todo, if the caller may claim from its queue and it is claimable. A concurrent
# claim of the same row waits for the first and then re-checks the guard, so only one wins.
CLAIM_ONE = f"""
UPDATE todos_todo t SET {_CLAIM_SET}
WHERE t.id = %(id)s AND t.queue LIKE ANY(%(scopes)s::text[]) AND {_CLAIMABLE}
RETURNING {_TODO_COLUMNS}
"""

# heartbeat: extend the lease. With the current receipt this also takes back a lapsed todo that was
# not re-claimed meanwhile (state claimed again; attempt unchanged: it is the same receive), but not one
# the reaper dead-lettered at its cap: only an operator revives a dead-letter (SPEC decision 1).
HEARTBEAT = f"""
UPDATE todos_todo SET
    state = 'claimed',
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    next_retry_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND state IN ('claimed', 'pending')
RETURNING {_TODO_COLUMNS}
"""

# complete: -> done.
COMPLETE = f"""
UPDATE todos_todo SET
    state = 'done',
    result = %(result)s,
    completed_at = now(),
    updated_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL
WHERE {_HOLDS_RECEIPT} AND state IN ('claimed', 'pending', 'failed')
RETURNING {_TODO_COLUMNS}
"""

# complete many: one statement for a batch of (id, lease_id, result); rows that come back were completed.
COMPLETE_MANY = f"""
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
  AND t.queue LIKE ANY(%(visible)s::text[]) AND t.state IN ('claimed', 'pending', 'failed')
RETURNING {", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))}
"""

# fail: -> failed (notifies when the retry is due at once, e.g. retry_in 0). Below the cap a retry is
# scheduled: after %(retry_in)s seconds if the caller gave it, else exponential backoff with full
# jitter, random() * min(cap, base * 2^(attempt-1)). At the cap next_retry_at stays NULL: a
# dead-letter (SPEC decision 4).
FAIL = _notifying(
    f"""
UPDATE todos_todo t SET
    state = 'failed',
    errors = t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', %(error)s::text)),
    next_retry_at = CASE WHEN t.attempt < t.max_attempts THEN now() + make_interval(secs => COALESCE(
        %(retry_in)s::double precision,
        random() * LEAST(%(backoff_cap)s::double precision,
                         %(backoff_base)s::double precision * power(2, GREATEST(t.attempt, 1) - 1))))
        END,
    lease_id = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND t.state IN ('claimed', 'pending', 'failed')
RETURNING {_TODO_COLUMNS}
""",
    when="next_retry_at <= now()",
)

# release: -> pending, handing the attempt back (a voluntary release costs no retry budget). Not from
# a dead-letter: handing back a lease the reaper dead-lettered at its cap would make it claimable again.
# Notifies.
RELEASE = _notifying(f"""
UPDATE todos_todo SET
    state = 'pending',
    attempt = GREATEST(attempt - 1, 0),
    owner = NULL,
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND state IN ('claimed', 'pending')
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
    owner = NULL,
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = %(id)s AND t.state = 'failed' AND t.next_retry_at IS NULL AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
""")

# requeue_lapsed (reaper): a batch of lapsed leases -> pending below the cap, dead-letter at it.
# Notifies the queues of the requeued ones.
# SKIP LOCKED lets several reapers (and claimers) share the work without waiting or double-handling.
REQUEUE_LAPSED = _notifying(
    f"""
WITH lapsed AS MATERIALIZED (
    SELECT id FROM todos_todo
    WHERE state = 'claimed' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE todos_todo t SET
    state = CASE WHEN t.attempt < t.max_attempts THEN 'pending' ELSE 'failed' END,
    errors = t.errors || {_LEASE_EXPIRED_ERROR},
    next_retry_at = NULL,
    updated_at = now()
FROM lapsed
WHERE t.id = lapsed.id
RETURNING t.id, t.queue, t.state
""",
    when="state = 'pending'",
)

# promote_due_retries (retry scheduler): a batch of failed todos whose retry is due -> pending. Notifies
# (a waiting claimer may already have woken at the due time; the notify covers waiters that started later).
PROMOTE_DUE_RETRIES = _notifying("""
WITH due AS MATERIALIZED (
    SELECT id FROM todos_todo
    WHERE state = 'failed' AND next_retry_at IS NOT NULL AND next_retry_at <= now()
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
        WHERE {SCHEDULED_DUE} AND t.queue = q.name
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

# Classifies a guarded UPDATE that touched no row: absent or invisible -> not found, else conflict.
CURRENT_STATE = """
SELECT state, next_retry_at IS NULL AS no_retry, lease_id, split_part(owner, '/', 1) AS owner_agent
FROM todos_todo WHERE id = %(id)s AND queue LIKE ANY(%(visible)s::text[])
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
WHERE t.id = ANY(%(ids)s::text[]) AND t.state = 'failed' AND t.next_retry_at IS NOT NULL
  AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
)

# discard (operator): pending, scheduled or failed (retry-waiting or dead) -> done, the result saying who
# and why.
# Never from claimed: a worker holds it and may be mid-way; the operator force-releases it first.
# done frees the idempotency key, so this can never collide with a newer runnable todo.
DISCARD = f"""
UPDATE todos_todo t SET
    state = 'done',
    result = jsonb_build_object('discarded_by', %(operator)s::text, 'reason', %(reason)s::text),
    completed_at = now(),
    owner = NULL,
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND t.state IN ('pending', 'scheduled', 'failed')
  AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""

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
    owner = NULL,
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND t.state = 'claimed' AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
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
WHERE t.id = ANY(%(ids)s::text[]) AND t.state = 'scheduled' AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
)

# set_priority (operator): a pending or scheduled todo's priority. Guard: one of those states, in the
# operator's scopes (a claimed one is being worked on: its priority no longer means anything); lock: the
# rows updated. Not recorded in errors (the admin's log records it); no notify: nothing new is claimable.
SET_PRIORITY = f"""
UPDATE todos_todo t SET priority = %(priority)s, updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND t.state IN ('pending', 'scheduled') AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
"""
