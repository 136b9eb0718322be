"""Retention per state: delete done todos after a short window, dead-letters after a long one, and
events once none of their todos remain (SPEC, `manage.py purge`).

Deleting finished rows is not a state transition, so it lives here rather than in todos/queue.py, and
its statements with it. Every batch is one short statement in its own transaction (autocommit) that
locks at most ``batch`` rows with SKIP LOCKED: it never waits for, or holds up, a claim, an operator or
another purge, and a reaper's sweep or an agent's claim never waits more than one batch for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from switchboard.metrics import PURGED

logger = logging.getLogger("switchboard.retention")

DAY = 86400.0

_DONE_PURGEABLE = "t.state = 'done' AND t.completed_at < now() - make_interval(secs => %(done_age)s)"
_DEAD_PURGEABLE = (
    "t.state = 'failed' AND t.next_retry_at IS NULL AND t.updated_at < now() - make_interval(secs => %(dead_age)s)"
)

# Done todos past the window, oldest first: a range scan of todo_done_recent.
PURGE_DONE = f"""
WITH doomed AS MATERIALIZED (
    SELECT t.id FROM todos_todo t
    WHERE {_DONE_PURGEABLE}
    ORDER BY t.completed_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM todos_todo t USING doomed WHERE t.id = doomed.id
"""

# Dead-letters past the window: a range scan of todo_failed_recent (retry-waiting rows are filtered
# out). The lock re-checks the row, so one an operator retried a moment ago (no longer dead) is left alone.
PURGE_DEAD = f"""
WITH doomed AS MATERIALIZED (
    SELECT t.id FROM todos_todo t
    WHERE {_DEAD_PURGEABLE}
    ORDER BY t.updated_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM todos_todo t USING doomed WHERE t.id = doomed.id
"""

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
                       WHERE t.event_id = e.id AND NOT ({_DONE_PURGEABLE}) AND NOT ({_DEAD_PURGEABLE})))
"""

# The daily purge belongs to whichever reaper moves this row's clock forward first; the others see a
# run started within the period and skip. The UPSERT's row lock makes concurrent reapers take turns.
CLAIM_PERIODIC_TASK = """
INSERT INTO todos_maintenance AS m (task, last_started_at) VALUES (%(task)s, now())
ON CONFLICT (task) DO UPDATE SET last_started_at = now()
WHERE m.last_started_at <= now() - make_interval(secs => %(every)s)
RETURNING m.task
"""


@dataclass(frozen=True)
class PurgeResult:
    done: int = 0
    dead: int = 0
    events: int = 0
    dry_run: bool = False
    stopped: bool = False

    @property
    def total(self) -> int:
        return self.done + self.dead + self.events


def purge(
    *,
    done_days: float | None = None,
    dead_days: float | None = None,
    batch: int | None = None,
    dry_run: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> PurgeResult:
    """Delete (or, with ``dry_run``, count) done todos older than ``done_days``, dead-letters older than
    ``dead_days``, then events older than ``done_days`` with no todo left. Defaults come from settings."""
    done_age = (settings.RETENTION_DONE_DAYS if done_days is None else done_days) * DAY
    dead_age = (settings.RETENTION_DEAD_DAYS if dead_days is None else dead_days) * DAY
    batch = batch or settings.PURGE_BATCH_SIZE
    if done_age < 0 or dead_age < 0 or batch < 1:
        raise ValueError("retention windows must be >= 0 days and the batch >= 1")
    params = {"done_age": done_age, "dead_age": dead_age, "batch": batch}
    if dry_run:
        with connection.cursor() as cursor:
            cursor.execute(COUNT_PURGEABLE, params)
            done, dead, events = cursor.fetchone()
        return PurgeResult(done=done, dead=dead, events=events, dry_run=True)

    stop = should_stop or (lambda: False)
    done = _delete_in_batches(PURGE_DONE, params, "done", stop)
    dead = _delete_in_batches(PURGE_DEAD, params, "dead", stop) if not stop() else 0
    events = _purge_events(params, stop) if not stop() else 0
    return PurgeResult(done=done, dead=dead, events=events, stopped=stop())


def _delete_in_batches(statement: str, params: dict[str, object], kind: str, stop: Callable[[], bool]) -> int:
    deleted = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            n = cursor.rowcount
        deleted += n
        PURGED.labels(kind=kind).inc(n)
        # Fewer than a batch: nothing older is left (or the rest is locked right now: next run).
        if n < params["batch"] or stop():  # type: ignore[operator]
            return deleted


def _purge_events(params: dict[str, object], stop: Callable[[], bool]) -> int:
    deleted = 0
    after: tuple[object, str] = ("-infinity", "")
    while not stop():
        with connection.cursor() as cursor:
            cursor.execute(EVENT_PAGE, {**params, "after_at": after[0], "after_id": after[1]})
            page = cursor.fetchall()
            if not page:
                break
            cursor.execute(PURGE_EVENTS, {"ids": [event_id for event_id, _ in page]})
            n = cursor.rowcount
        deleted += n
        PURGED.labels(kind="event").inc(n)
        after = (page[-1][1], page[-1][0])
        if len(page) < params["batch"]:  # type: ignore[operator]
            break
    return deleted


def claim_periodic_task(task: str, *, every_seconds: float) -> bool:
    """True for exactly one caller per ``every_seconds`` across all processes."""
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_PERIODIC_TASK, {"task": task, "every": every_seconds})
        return cursor.fetchone() is not None


def claim_daily_purge() -> bool:
    return claim_periodic_task("purge", every_seconds=DAY)
