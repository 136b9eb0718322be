"""The reaper's batches: lapsed leases, due retries and due scheduled todos to pending."""

from todos import states as S
from todos.sql.common import _ERRORS_KEPT, _finishing, _notifying

_LEASE_EXPIRED_ERROR = """jsonb_build_array(jsonb_build_object(
    'attempt', t.attempt, 'at', t.lease_expires_at, 'error', 'lease expired'))"""

# requeue_lapsed (reaper): a batch of lapsed leases -> pending below the cap, dead-letter at it (which
# settles its dependents). Notifies the queues of the requeued ones.
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
    errors = jsonb_path_query_array(t.errors || {_LEASE_EXPIRED_ERROR}, {_ERRORS_KEPT}),
    next_retry_at = NULL,
    updated_at = now()
FROM lapsed
WHERE t.id = lapsed.id
RETURNING t.id, t.queue, t.state, t.next_retry_at, t.has_dependents
""",
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
