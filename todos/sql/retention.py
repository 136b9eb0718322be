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
