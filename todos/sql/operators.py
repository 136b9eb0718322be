"""Operator transitions (the admin's actions). Each names the operator in errors or result.

Each takes a list of ids (%(ids)s) so the admin's bulk runs make one statement per batch; the
single-todo functions pass a list of one. The guard applies to each row on its own: rows that do
not pass it are left alone and simply not returned.
"""

from todos import states as S
from todos.sql.common import _ERRORS_KEPT, _TODO_COLUMNS, _finishing, _notifying

# retry_dead_letter (operator): dead-letter -> pending, with a new budget (reset) or one more try (once).
# Notifies.
RETRY_DEAD_LETTER = _notifying(f"""
UPDATE todos_todo t SET
    state = 'pending',
    attempt = CASE WHEN %(mode)s = 'reset' THEN 0 ELSE t.attempt END,
    max_attempts = CASE WHEN %(mode)s = 'once' THEN GREATEST(t.max_attempts, t.attempt + 1) ELSE t.max_attempts END,
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator retry',
        'operator', %(operator)s::text, 'mode', %(mode)s::text, 'note', %(note)s::text)), {_ERRORS_KEPT}),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = %(id)s AND {S.DEAD_LETTER.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
""")

# retry_now (operator): retry-waiting -> pending at once, as promote_due_retries would do when the retry
# falls due. Straight to pending (not next_retry_at = now()) so the operator sees the effect on the
# next page load instead of after the reaper's next sweep. Recorded in errors, like operator retry.
# Notifies, waking long-polls of the queue.
RETRY_NOW = _notifying(
    f"""
UPDATE todos_todo t SET
    state = 'pending',
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator retry now', 'operator', %(operator)s::text)),
        {_ERRORS_KEPT}),
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
)

# force_release (operator): claimed -> pending whatever the receipt. The attempt stays counted (it was
# a receive, as with a lapse); the old receipt is voided, so the stuck worker gets 409 if it wakes up.
# Notifies, waking long-polls of the queue.
FORCE_RELEASE = _notifying(
    f"""
UPDATE todos_todo t SET
    state = 'pending',
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator force-release',
        'operator', %(operator)s::text, 'owner', t.owner)), {_ERRORS_KEPT}),
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
# cancelled; the receipt is kept as revoked_lease_id (never shown), so that its holder's late complete is kept
# as a tombstone (todos/sql/trees.py, LATE_RESULT). Who and why go into errors, beside the owner it was
# taken from. Terminal: frees the idempotency key (cancelled is not runnable). Notifies: a cancelled lease
# frees a slot of a queue with max_claimed (cancels are rare; the few needless wakes cost nothing).
CANCEL = _finishing(
    f"""
UPDATE todos_todo t SET
    state = 'cancelled',
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'cancelled', 'cancelled_by', %(operator)s::text,
        'reason', %(reason)s::text, 'was', t.state, 'owner', t.owner)), {_ERRORS_KEPT}),
    completed_at = now(),
    revoked_lease_id = t.lease_id,
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE t.id = ANY(%(ids)s::text[]) AND {S.CANCELLABLE.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {_TODO_COLUMNS}
""",
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
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'operator run now', 'operator', %(operator)s::text)),
        {_ERRORS_KEPT}),
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
