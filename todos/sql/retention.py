"""Retention (todos/retention.py).

Deleting finished rows is not a transition. Every batch is one short statement that locks at most
%(batch)s rows with SKIP LOCKED: it never waits for, or holds up, a claim, an operator or another purge.
"""

from todos import states as S

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
# Dead-letters past the window: a range scan of todo_failed_recent (dead-letters only, migration 0042).
# The lock re-checks the row, so one an operator retried a moment ago (no longer dead) is left alone.
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

# Queues (issue 28, M4): a queue row left with no todo that could still run (pending, scheduled, claimed,
# waiting, retry-waiting) nor a dead-letter an operator may retry, whose controls were never set (or were
# set back to the defaults), registered longer ago than the done window, is deleted: a glob create scope's
# spent names stop costing claims, GET /queues/, the dashboard and /metrics. A later create registers the
# name again. Done and cancelled todos (terminal) do not keep a queue; they keep their queue name.
# One NOT EXISTS per state, each a probe of that state's partial index with queue first.
_QUEUE_HAS_WORK = " OR ".join(
    f"EXISTS (SELECT FROM todos_todo t WHERE t.queue = q.name AND {condition.sql('t')})"
    for condition in (S.PENDING, S.SCHEDULED, S.CLAIMED, S.WAITING, S.RETRY_WAITING, S.DEAD_LETTER)
)
_QUEUE_UNCONTROLLED = """NOT q.paused AND q.max_claimed IS NULL AND q.rate_per_second IS NULL
    AND q.rate_burst IS NULL AND NOT q.fair AND q.fair_weights = '{}'::jsonb AND q.max_claimed_per_key IS NULL"""

# A page of prunable queues in name order after %(after)s, locked FOR UPDATE SKIP LOCKED: a create into one
# of them holds its row FOR KEY SHARE until it commits (the registry triggers, migration 0023), so a queue
# being written to is passed over. Run in a transaction with PRUNE_QUEUES, which keeps the locks.
LOCK_PRUNABLE_QUEUES = f"""
SELECT q.name FROM todos_queue q
WHERE q.name > %(after)s AND q.created_at < now() - make_interval(secs => %(done_age)s)
  AND {_QUEUE_UNCONTROLLED} AND NOT ({_QUEUE_HAS_WORK})
ORDER BY q.name
LIMIT %(batch)s
FOR UPDATE OF q SKIP LOCKED
"""

# Then, under those locks, in a statement of its own (a fresh snapshot: it sees every create that committed
# before the lock was taken), the queues still without work are deleted, with any fair-key rows a queue kept
# from when it was fair. A create that comes after the lock waits for this transaction, finds its queue's row
# gone, and registers it again.
PRUNE_QUEUES = f"""
WITH pruned AS (
    DELETE FROM todos_queue q WHERE q.name = ANY(%(names)s::text[]) AND NOT ({_QUEUE_HAS_WORK})
    RETURNING q.name
), keys AS (
    DELETE FROM todos_fairkey k USING pruned WHERE k.queue = pruned.name
), ready AS (
    -- stale fair reservations (issue 31) of a queue with no work left: nothing else would meet them
    DELETE FROM todos_fairready r USING pruned WHERE r.queue = pruned.name
)
SELECT count(*) FROM pruned
"""

COUNT_PRUNABLE_QUEUES = f"""
SELECT count(*) FROM todos_queue q
WHERE q.created_at < now() - make_interval(secs => %(done_age)s) AND {_QUEUE_UNCONTROLLED} AND NOT ({_QUEUE_HAS_WORK})
"""
