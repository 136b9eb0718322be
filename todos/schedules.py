"""Recurring schedules: which ticks of a cron expression get a todo, made by the reaper sidecars.

Each sweep of every reaper calls ``run_due_schedules``. A schedule is due when its next tick is within
SCHEDULE_LOOKAHEAD_SECONDS: its todo is then created ahead of time as a *scheduled* todo with run_at =
the tick, so the claim scan hands it out exactly at the tick, not at the next sweep after it.

Exactly once per tick, however many reapers run:
  * a schedule is handled in one short transaction that holds its row (FOR UPDATE SKIP LOCKED: another
    reaper skips it rather than waits), and moves last_tick_at past every tick it dealt with;
  * each todo's idempotency key is ``schedule:<name>:<tick as UTC RFC 3339>``, so even a todo made twice
    for one tick would come back as the first one while it can still run.

After downtime, the ticks that passed unseen follow ``catch_up``: ``latest`` (the default) makes only
the most recent one, so a reaper that was down for a day does not burst 1,440 todos of an every-minute
schedule; ``none`` makes none; ``all`` makes each of them, at most SCHEDULE_CATCH_UP_MAX (the most recent).

Time zones and DST follow cronsim (Debian cron's rules) for expressions with fixed minute and hour
fields: on the spring-forward day a time that does not exist runs at the first minute after the gap
(02:30 Europe/Berlin on the last Sunday of March runs at 03:00 CEST); on the fall-back day a time that
occurs twice runs once, at its first occurrence (02:30 CEST, not again at 02:30 CET). Expressions with
a wildcard minute or hour (``*/15 * * * *``) run on the wall clock as it is, once per real occurrence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from switchboard import dberrors
from todos import queue
from todos.limits import SCHEDULE_CATCH_UP_MAX
from todos.models import CatchUp, Schedule

logger = logging.getLogger("switchboard.schedules")

# A broken schedule (a cron or zone that no longer parses, a queue name refused) is looked at again after
# this long, not on every sweep: one log line a minute, not one a second.
BROKEN_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class ScheduleResult:
    todos_created: int = 0
    ticks_skipped: int = 0
    broken: int = 0


def tick_key(schedule_name: str, tick: datetime) -> str:
    return f"schedule:{schedule_name}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def _ticks_after(cron: str, tz: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    """The ticks in (after, until], in UTC, ascending."""
    ticks: list[datetime] = []
    for local in CronSim(cron, after.astimezone(tz)):
        tick = local.astimezone(UTC)
        if tick > until:
            break
        if tick > after:  # a fall-back day can hand back a first occurrence already past: skip it
            ticks.append(tick)
    return ticks


def _ticks_before(cron: str, tz: ZoneInfo, before: datetime, since: datetime, limit: int) -> list[datetime]:
    """The latest ``limit`` ticks in (since, before], in UTC, ascending; read backwards from ``before`` so
    a year of downtime costs ``limit`` steps, not a year of ticks."""
    # cronsim's reverse iteration includes ``before`` itself only when it has a fraction of a second.
    start = before if before.microsecond else before + timedelta(microseconds=1)
    ticks: list[datetime] = []
    for local in CronSim(cron, start.astimezone(tz), reverse=True):
        tick = local.astimezone(UTC)
        if tick <= since or len(ticks) >= limit:
            break
        if tick <= before:
            ticks.append(tick)
    return sorted(set(ticks))


def next_tick(schedule: Schedule, after: datetime) -> datetime | None:
    """The schedule's first tick after ``after`` (UTC), or None if its cron or zone does not parse."""
    try:
        tz = ZoneInfo(schedule.timezone)
        for local in CronSim(schedule.cron, after.astimezone(tz)):
            tick = local.astimezone(UTC)
            if tick > after:
                return tick
    except Exception:  # a broken schedule: shown as such, never an error page
        return None
    return None


def plan(schedule: Schedule, now: datetime, lookahead: float) -> tuple[list[datetime], list[datetime]]:
    """(ticks to make a todo for, ticks skipped by catch_up) at database time ``now``: the ones that passed
    since the last tick dealt with (or since the schedule was made), by catch_up, and the ones coming within
    ``lookahead`` seconds."""
    tz = ZoneInfo(schedule.timezone)
    since = schedule.last_tick_at or schedule.created_at
    missed_limit = SCHEDULE_CATCH_UP_MAX if schedule.catch_up == CatchUp.ALL else 1
    missed = _ticks_before(schedule.cron, tz, now, since, missed_limit)
    if schedule.catch_up == CatchUp.NONE:
        skipped, missed = missed, []
    else:
        skipped = []
    upcoming = _ticks_after(schedule.cron, tz, max(since, now), now + timedelta(seconds=lookahead))
    return missed + upcoming, skipped


def _run_one(schedule_id: int, lookahead: float) -> tuple[int, int]:
    """Handle one schedule in one transaction; (todos created, ticks skipped). (0, 0) if another reaper
    holds it or has already dealt with its ticks."""
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(pk=schedule_id, is_active=True)
            .filter(Q(next_tick_at__isnull=True) | Q(next_tick_at__lte=_horizon(lookahead)))
            .first()
        )
        if schedule is None:
            return 0, 0
        now = _db_now()
        ticks, skipped = plan(schedule, now, lookahead)
        created = 0
        for tick in ticks:
            todo, made = queue.create(
                queue=schedule.queue,
                kind=schedule.kind,
                title=schedule.title,
                payload=schedule.payload,
                source="schedule",
                idempotency_key=tick_key(schedule.name, tick),
                max_attempts=schedule.max_attempts,
                run_at=tick,
                priority=schedule.priority,
                fair_key=schedule.fair_key,
                limits=schedule.limits or None,
            )
            created += made
            schedule.last_todo_id = todo.id
        dealt = ticks + skipped
        if dealt:
            schedule.last_tick_at = max(dealt)
        after = max(schedule.last_tick_at or schedule.created_at, now)
        # None: no tick in cronsim's 50 years; look again in a day rather than on every sweep.
        schedule.next_tick_at = next_tick(schedule, after) or now + timedelta(days=1)
        schedule.last_error = ""
        schedule.save(update_fields=["last_tick_at", "next_tick_at", "last_todo_id", "last_error"])
        if skipped:
            logger.info(
                "schedule %s: %d missed tick(s) skipped (catch_up=%s)", schedule.name, len(skipped), schedule.catch_up
            )
        return created, len(skipped)


def _db_now() -> datetime:
    # Every time a tick is compared with is the database's (SPEC decision 7).
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _horizon(lookahead: float) -> RawSQL:
    return RawSQL("now() + make_interval(secs => %s)", [lookahead])


def run_due_schedules(lookahead: float | None = None) -> ScheduleResult:
    """Make the todos of every active schedule whose next tick is within the lookahead. A schedule that
    cannot be handled is logged, marked with its error and skipped; the others go on."""
    lookahead = float(settings.SCHEDULE_LOOKAHEAD_SECONDS if lookahead is None else lookahead)
    due = list(
        Schedule.objects.filter(is_active=True)
        .filter(Q(next_tick_at__isnull=True) | Q(next_tick_at__lte=_horizon(lookahead)))
        .order_by("pk")
        .values_list("pk", "name")
    )
    created = skipped = broken = 0
    for pk, name in due:
        try:
            made, passed = _run_one(pk, lookahead)
        except Exception as exc:  # this schedule is broken; the rest are not
            if isinstance(exc, DatabaseError) and dberrors.classify(exc) is dberrors.Failure.UNAVAILABLE:
                raise  # the database is gone: the sweep's own handler says so
            broken += 1
            logger.warning("schedule %s skipped: %s: %s", name, exc.__class__.__name__, exc)
            Schedule.objects.filter(pk=pk).update(
                last_error=f"{exc.__class__.__name__}: {exc}"[:1000],
                next_tick_at=Now() + timedelta(seconds=BROKEN_RETRY_SECONDS),
            )
            continue
        created += made
        skipped += passed
    return ScheduleResult(todos_created=created, ticks_skipped=skipped, broken=broken)
