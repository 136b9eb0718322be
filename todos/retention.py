"""Retention per state: delete done todos after a short window, dead-letters after a long one, cancelled
todos after their own window (the done one unless set), events once none of their todos remain
(SPEC, `manage.py purge`), and queues left with no work and no controls (issue 28, M4).

Deleting finished rows is not a state transition, so it lives here rather than in todos/queue/; its
statements are in todos/sql/ with the others on the todos table. Every batch is one short statement in
its own transaction (autocommit) that locks at most ``batch`` rows with SKIP LOCKED: it never waits for,
or holds up, a claim, an operator or another purge, and a reaper's sweep or an agent's claim never waits
more than one batch for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from todos import sql
from todos.metrics import PURGED

logger = logging.getLogger("switchboard.retention")

DAY = 86400.0

# The daily purge belongs to whichever reaper moves its row's clock forward first; the others see a
# run started recently and skip. The UPSERT's row lock makes concurrent reapers take turns. Only a run
# that finishes spends the period: it records its start in the "<task>:done" row. Until such a run,
# a purge that failed, crashed or was stopped is started again once its attempt is retry_seconds old.
CLAIM_PERIODIC_TASK = """
INSERT INTO todos_maintenance AS m (task, last_started_at) VALUES (%(task)s, now())
ON CONFLICT (task) DO UPDATE SET last_started_at = now()
WHERE m.last_started_at <= now() - make_interval(secs => LEAST(%(every)s, %(retry)s))
  AND NOT EXISTS (
    SELECT 1 FROM todos_maintenance done
    WHERE done.task = %(task)s || ':done' AND done.last_started_at > now() - make_interval(secs => %(every)s))
RETURNING m.last_started_at
"""

FINISH_PERIODIC_TASK = """
INSERT INTO todos_maintenance AS m (task, last_started_at) VALUES (%(task)s || ':done', %(started)s)
ON CONFLICT (task) DO UPDATE SET last_started_at = GREATEST(m.last_started_at, EXCLUDED.last_started_at)
"""

# How soon a daily purge that did not finish is tried again: long enough that a purge failing for a
# lasting reason (a full disk) does not run every few minutes, short enough to catch up the same day.
PURGE_RETRY_SECONDS = 3600.0


@dataclass(frozen=True)
class PurgeResult:
    done: int = 0
    dead: int = 0
    events: int = 0
    cancelled: int = 0
    queues: int = 0
    dry_run: bool = False
    stopped: bool = False

    @property
    def total(self) -> int:
        return self.done + self.dead + self.events + self.cancelled + self.queues


def purge(
    *,
    done_days: float | None = None,
    dead_days: float | None = None,
    cancelled_days: float | None = None,
    batch: int | None = None,
    dry_run: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> PurgeResult:
    """Delete (or, with ``dry_run``, count) done todos older than ``done_days``, dead-letters older than
    ``dead_days``, cancelled todos older than ``cancelled_days``, then events older than ``done_days`` with no
    todo left, then queues registered before the done window that hold no work and were never configured
    (todos/sql/retention.py, LOCK_PRUNABLE_QUEUES). Defaults come from settings."""
    done_age = (settings.RETENTION_DONE_DAYS if done_days is None else done_days) * DAY
    dead_age = (settings.RETENTION_DEAD_DAYS if dead_days is None else dead_days) * DAY
    cancelled_age = (settings.RETENTION_CANCELLED_DAYS if cancelled_days is None else cancelled_days) * DAY
    batch = batch or settings.PURGE_BATCH_SIZE
    if done_age < 0 or dead_age < 0 or cancelled_age < 0 or batch < 1:
        raise ValueError("retention windows must be >= 0 days and the batch >= 1")
    params = {"done_age": done_age, "dead_age": dead_age, "cancelled_age": cancelled_age, "batch": batch}
    if dry_run:
        with connection.cursor() as cursor:
            cursor.execute(sql.COUNT_PURGEABLE, params)
            done, dead, events, cancelled = cursor.fetchone()
            cursor.execute(sql.COUNT_PRUNABLE_QUEUES, params)
            (queues,) = cursor.fetchone()
        return PurgeResult(done=done, dead=dead, events=events, cancelled=cancelled, queues=queues, dry_run=True)

    stop = should_stop or (lambda: False)
    done = _delete_in_batches(sql.PURGE_DONE, params, "done", stop)
    dead = _delete_in_batches(sql.PURGE_DEAD, params, "dead", stop) if not stop() else 0
    cancelled = _delete_in_batches(sql.PURGE_CANCELLED, params, "cancelled", stop) if not stop() else 0
    events = _purge_events(params, stop) if not stop() else 0
    queues = _prune_queues(params, stop) if not stop() else 0
    return PurgeResult(done=done, dead=dead, events=events, cancelled=cancelled, queues=queues, stopped=stop())


def _delete_in_batches(statement: str, params: dict[str, Any], kind: str, stop: Callable[[], bool]) -> int:
    deleted = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            n: int = cursor.rowcount
        deleted += n
        PURGED.labels(kind=kind).inc(n)
        # Fewer than a batch: nothing older is left (or the rest is locked right now: next run).
        if n < params["batch"] or stop():
            return deleted


def _purge_events(params: dict[str, Any], stop: Callable[[], bool]) -> int:
    deleted = 0
    after: tuple[Any, str] = ("-infinity", "")
    while not stop():
        with connection.cursor() as cursor:
            cursor.execute(sql.EVENT_PAGE, {**params, "after_at": after[0], "after_id": after[1]})
            page = cursor.fetchall()
            if not page:
                break
            cursor.execute(sql.PURGE_EVENTS, {"ids": [event_id for event_id, _ in page]})
            n: int = cursor.rowcount
        deleted += n
        PURGED.labels(kind="event").inc(n)
        after = (page[-1][1], page[-1][0])
        if len(page) < params["batch"]:
            break
    return deleted


def _prune_queues(params: dict[str, Any], stop: Callable[[], bool]) -> int:
    """A page of queues at a time, each page one short transaction: lock the prunable rows (SKIP LOCKED),
    then delete those still without work, under the locks (todos/sql/retention.py says why two statements)."""
    deleted = 0
    after = ""
    while not stop():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.LOCK_PRUNABLE_QUEUES, {**params, "after": after})
            names = [name for (name,) in cursor.fetchall()]
            if not names:
                break
            cursor.execute(sql.PRUNE_QUEUES, {"names": names})
            (n,) = cursor.fetchone()
        deleted += n
        PURGED.labels(kind="queue").inc(n)
        after = names[-1]
        if len(names) < params["batch"]:
            break
    return deleted


def claim_periodic_task(task: str, *, every_seconds: float, retry_seconds: float) -> datetime | None:
    """The start time of this run, for exactly one caller at a time, once per ``every_seconds`` since
    the last run that finished (finish_periodic_task), and at most once per ``retry_seconds`` until
    one has; None for every other caller."""
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_PERIODIC_TASK, {"task": task, "every": every_seconds, "retry": retry_seconds})
        row = cursor.fetchone()
    return row[0] if row is not None else None


def finish_periodic_task(task: str, started: datetime) -> None:
    """The run that ``claim_periodic_task`` started at ``started`` finished: it spends its period."""
    with connection.cursor() as cursor:
        cursor.execute(FINISH_PERIODIC_TASK, {"task": task, "started": started})


def claim_daily_purge() -> datetime | None:
    return claim_periodic_task("purge", every_seconds=DAY, retry_seconds=PURGE_RETRY_SECONDS)


def run_daily_purge(started: datetime, should_stop: Callable[[], bool] | None = None) -> PurgeResult:
    """The purge that claim_daily_purge granted; it spends the day only if it runs to the end."""
    result = purge(should_stop=should_stop)
    if not result.stopped:
        finish_periodic_task("purge", started)
    return result
