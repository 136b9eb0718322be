"""Recurring schedules (issue 12): which ticks get a todo (catch-up, time zones and DST), exactly once
however many reapers run, a broken schedule skipped, add_schedule, and the admin page."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from todos import limits, queue, schedules
from todos.models import CatchUp, Schedule, Todo, TodoState


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def _schedule(cron: str, *, tz: str = "UTC", catch_up: str = CatchUp.LATEST, since: datetime) -> Schedule:
    return Schedule(name="s", cron=cron, timezone=tz, queue="q", catch_up=catch_up, created_at=since)


def _sweep_every(schedule: Schedule, start: datetime, end: datetime, step: timedelta, lookahead: float) -> list:
    """The ticks a reaper sweeping every ``step`` from ``start`` to ``end`` makes todos for, as _run_one
    keeps the schedule's bookkeeping (last_tick_at = the latest tick dealt with)."""
    made = []
    now = start
    while now <= end:
        ticks, skipped = schedules.plan(schedule, now, lookahead)
        made += ticks
        if ticks or skipped:
            schedule.last_tick_at = max(ticks + skipped)
        now += step
    return made


# --- which ticks ----------------------------------------------------------------------------------


def test_after_downtime_only_the_latest_missed_tick_runs_by_default():
    s = _schedule("*/5 * * * *", since=_utc(2026, 1, 1, 0, 0))
    s.last_tick_at = _utc(2026, 1, 1, 0, 0)
    ticks, skipped = schedules.plan(s, _utc(2026, 1, 1, 6, 2, 30), lookahead=0)
    assert ticks == [_utc(2026, 1, 1, 6, 0)] and skipped == []


def test_catch_up_none_skips_every_missed_tick_and_runs_the_next_one():
    s = _schedule("*/5 * * * *", catch_up=CatchUp.NONE, since=_utc(2026, 1, 1))
    s.last_tick_at = _utc(2026, 1, 1, 0, 0)
    ticks, skipped = schedules.plan(s, _utc(2026, 1, 1, 0, 12), lookahead=240)
    assert ticks == [_utc(2026, 1, 1, 0, 15)]  # coming within the lookahead: made ahead of time
    assert skipped == [_utc(2026, 1, 1, 0, 10)]  # only the latest is read back; the rest need no look


def test_catch_up_all_runs_every_missed_tick_up_to_the_cap():
    s = _schedule("* * * * *", catch_up=CatchUp.ALL, since=_utc(2026, 1, 1))
    s.last_tick_at = _utc(2026, 1, 1, 0, 0)
    ticks, _ = schedules.plan(s, _utc(2026, 1, 1, 0, 7, 30), lookahead=0)
    assert ticks == [_utc(2026, 1, 1, 0, m) for m in range(1, 8)]
    ticks, _ = schedules.plan(s, _utc(2026, 1, 2), lookahead=0)  # 1,440 missed
    assert len(ticks) == limits.SCHEDULE_CATCH_UP_MAX and ticks[-1] == _utc(2026, 1, 2) and ticks[0] > s.last_tick_at


def test_a_new_schedule_runs_nothing_from_before_it_was_made():
    s = _schedule("* * * * *", catch_up=CatchUp.ALL, since=_utc(2026, 1, 1, 0, 0, 30))
    ticks, _ = schedules.plan(s, _utc(2026, 1, 1, 0, 0, 40), lookahead=30)
    assert ticks == [_utc(2026, 1, 1, 0, 1)]


def test_tick_keys_are_the_tick_in_utc_rfc3339():
    berlin = datetime(2026, 3, 29, 3, 0, tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert schedules.tick_key("nightly", berlin) == "schedule:nightly:2026-03-29T01:00:00Z"


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        # Spring forward (Sunday 29 March 2026, 02:00 CET -> 03:00 CEST): 02:30 does not exist that day and
        # runs at 03:00 CEST, the first minute after the gap; the days around it run at 02:30.
        (
            _utc(2026, 3, 27, 12),
            _utc(2026, 3, 31, 12),
            [_utc(2026, 3, 28, 1, 30), _utc(2026, 3, 29, 1, 0), _utc(2026, 3, 30, 0, 30), _utc(2026, 3, 31, 0, 30)],
        ),
        # Fall back (Sunday 25 October 2026, 03:00 CEST -> 02:00 CET): 02:30 happens twice and runs once,
        # at its first occurrence (02:30 CEST = 00:30 UTC).
        (
            _utc(2026, 10, 23, 12),
            _utc(2026, 10, 27, 12),
            [
                _utc(2026, 10, 24, 0, 30),
                _utc(2026, 10, 25, 0, 30),
                _utc(2026, 10, 26, 1, 30),
                _utc(2026, 10, 27, 1, 30),
            ],
        ),
    ],
    ids=["spring-forward", "fall-back"],
)
def test_daily_0230_in_berlin_runs_once_a_day_across_dst_as_documented(start, end, expected):
    # A reaper sweeping every 10 minutes with a minute's lookahead, as deployed; and one that was down
    # the whole time and catches up with catch_up=all at the end: both make the same ticks.
    swept = _sweep_every(
        _schedule("30 2 * * *", tz="Europe/Berlin", since=start), start, end, timedelta(minutes=10), 60
    )
    assert swept == expected
    late, _ = schedules.plan(
        _schedule("30 2 * * *", tz="Europe/Berlin", catch_up=CatchUp.ALL, since=start), end, lookahead=0
    )
    assert late == expected


def test_an_every_15_minutes_schedule_in_berlin_runs_each_real_quarter_hour_on_the_fall_back_night():
    start, end = _utc(2026, 10, 24, 23, 50), _utc(2026, 10, 25, 2, 10)  # 01:50 CEST .. 03:10 CET
    ticks = _sweep_every(
        _schedule("*/15 * * * *", tz="Europe/Berlin", since=start), start, end, timedelta(minutes=1), 60
    )
    assert ticks == [start + timedelta(minutes=10 + 15 * i) for i in range(9)]  # 00:00Z .. 02:00Z
    assert len(set(ticks)) == len(ticks)


# --- the reapers ------------------------------------------------------------------------------------


def _make(name: str, cron: str = "* * * * *", **kw) -> Schedule:
    return Schedule.objects.create(name=name, cron=cron, queue="cron.q", **kw)


def test_a_sweep_makes_the_coming_tick_ahead_of_time_as_a_scheduled_todo(db):
    s = _make("every-minute")
    result = schedules.run_due_schedules(lookahead=60)
    s.refresh_from_db()
    [todo] = Todo.objects.all()
    assert result.todos_created == 1 and s.last_todo_id == todo.id
    assert todo.state == TodoState.SCHEDULED and todo.run_at == s.last_tick_at and todo.source == "schedule"
    assert todo.idempotency_key == schedules.tick_key("every-minute", todo.run_at)
    assert s.next_tick_at == s.last_tick_at + timedelta(minutes=1)
    # Not due again until its next tick is within the lookahead.
    assert schedules.run_due_schedules(lookahead=60).todos_created == 0


def test_a_schedule_carries_its_queue_kind_title_payload_priority_and_attempts(db):
    _make("full", kind="report", title="Daily", payload={"a": 1}, priority=-3, max_attempts=2)
    schedules.run_due_schedules(lookahead=60)
    todo = Todo.objects.get()
    assert (todo.queue, todo.kind, todo.title, todo.payload, todo.priority, todo.max_attempts) == (
        "cron.q",
        "report",
        "Daily",
        {"a": 1},
        -3,
        2,
    )


def test_an_inactive_schedule_makes_nothing(db):
    _make("off", is_active=False)
    assert schedules.run_due_schedules(lookahead=60).todos_created == 0 and not Todo.objects.exists()


def test_a_broken_schedule_is_logged_and_skipped_and_the_others_run(db, caplog):
    broken = _make("broken", cron="not a cron")  # written past the validators, as a bad edit in SQL would be
    _make("bad-zone", timezone="Mars/Olympus")
    _make("fine")
    with caplog.at_level(logging.WARNING, logger="switchboard.schedules"):
        result = schedules.run_due_schedules(lookahead=60)
    assert result.broken == 2 and result.todos_created == 1
    assert {t.queue for t in Todo.objects.all()} == {"cron.q"}
    assert "schedule broken skipped" in caplog.text and "schedule bad-zone skipped" in caplog.text
    broken.refresh_from_db()
    assert "CronSimError" in broken.last_error
    # Looked at again a minute later, not on every sweep.
    assert schedules.run_due_schedules(lookahead=60).broken == 0


@pytest.mark.django_db(transaction=True)
def test_three_reapers_make_one_todo_per_tick(db):
    s = _make("busy", catch_up=CatchUp.ALL)
    Schedule.objects.filter(pk=s.pk).update(created_at=s.created_at - timedelta(minutes=10))
    barrier = threading.Barrier(3)
    made: list[int] = []
    lock = threading.Lock()

    def reaper() -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(10):
                n = schedules.run_due_schedules(lookahead=60).todos_created
                with lock:
                    made.append(n)
                # Work on the made todos finishes at once, freeing their keys: the schedule's own record
                # of its ticks must still keep a late reaper from making a tick again.
                with connection.cursor() as cursor:
                    cursor.execute("UPDATE todos_todo SET state = 'done', completed_at = now() WHERE state <> 'done'")
        finally:
            connection.close()

    threads = [threading.Thread(target=reaper) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    keys = Counter(Todo.objects.values_list("idempotency_key", flat=True))
    assert keys and max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    assert 10 <= len(keys) <= 12  # 10 missed minutes, plus the ones coming within the minute's lookahead
    assert sum(made) == len(keys)


# --- add_schedule ---------------------------------------------------------------------------------------


def test_add_schedule_makes_the_schedule_as_the_issue_writes_it(db, capsys):
    call_command(
        "add_schedule",
        "nightly-digest",
        "--cron",
        "30 2 * * *",
        "--queue",
        "reports",
        "--kind",
        "digest",
        "--title",
        "Nightly digest",
        "--payload",
        '{"scope": "all"}',
        "--timezone",
        "Europe/Berlin",
        "--priority",
        "-5",
        "--catch-up",
        "none",
    )
    s = Schedule.objects.get(name="nightly-digest")
    assert (s.cron, s.queue, s.kind, s.title, s.payload, s.timezone, s.priority, s.catch_up) == (
        "30 2 * * *",
        "reports",
        "digest",
        "Nightly digest",
        {"scope": "all"},
        "Europe/Berlin",
        -5,
        "none",
    )
    assert "first run" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--cron", "61 * * * *"], "--cron"),
        (["--cron", "* * * *"], "--cron"),
        (["--cron", "0 0 31 2 *"], "--cron"),
        (["--timezone", "Europe/Atlantis"], "--timezone"),
        (["--priority", "500"], "--priority"),
        (["--payload", "{nope"], "--payload"),
        (["--queue", "bad queue"], "--queue"),
    ],
)
def test_add_schedule_refuses_bad_input_naming_it_and_writes_nothing(db, args, named):
    base = {"--cron": "0 * * * *", "--queue": "q"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    with pytest.raises(CommandError) as refused:
        call_command("add_schedule", "s", *[x for pair in base.items() for x in pair])
    assert named in str(refused.value)
    assert not Schedule.objects.exists()


def test_add_schedule_refuses_a_name_taken(db):
    _make("taken")
    with pytest.raises(CommandError, match="exists"):
        call_command("add_schedule", "taken", "--cron", "0 * * * *", "--queue", "q")


# --- the admin ------------------------------------------------------------------------------------------


def test_the_admin_lists_schedules_with_next_run_and_last_todo(admin_client):
    s = _make("listed", cron="0 3 * * *", timezone="Europe/Berlin")
    schedules.run_due_schedules(lookahead=24 * 3600)
    s.refresh_from_db()
    page = admin_client.page(reverse("admin:todos_schedule_changelist"))
    assert "listed" in page and "03:00 CE" in page and s.last_todo_id in page


def test_the_admin_refuses_a_bad_cron_naming_it(admin_client):
    response = admin_client.post(
        reverse("admin:todos_schedule_add"),
        {
            "name": "x",
            "cron": "every day",
            "timezone": "UTC",
            "queue": "q",
            "payload": "{}",
            "priority": 0,
            "catch_up": "latest",
            "is_active": "on",
        },
    )
    assert response.status_code == 200 and "not a 5-field cron expression" in response.content.decode()
    assert not Schedule.objects.exists()


def test_editing_the_cron_in_the_admin_makes_the_reapers_work_out_the_next_tick_again(admin_client):
    s = _make("edited", cron="0 3 * * *")
    schedules.run_due_schedules(lookahead=60)
    s.refresh_from_db()
    assert s.next_tick_at is not None
    data = {
        "name": "edited",
        "cron": "0 4 * * *",
        "timezone": "UTC",
        "queue": "cron.q",
        "kind": "",
        "title": "",
        "payload": "{}",
        "priority": 0,
        "catch_up": "latest",
        "is_active": "on",
    }
    response = admin_client.post(reverse("admin:todos_schedule_change", args=[s.pk]), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    s.refresh_from_db()
    assert s.cron == "0 4 * * *" and s.next_tick_at is None


@pytest.mark.django_db(transaction=True)
def test_a_reaper_sweep_makes_schedule_todos_and_promotes_due_scheduled_ones():
    _make("swept")
    due, _ = queue.create(queue="q", delay_seconds=3600)
    Todo.objects.filter(pk=due.pk).update(run_at=due.created_at - timedelta(seconds=1))
    call_command("reap_leases", "--once")
    assert Todo.objects.get(pk=due.pk).state == TodoState.PENDING
    assert Todo.objects.filter(source="schedule", queue="cron.q").count() == 1


def test_a_schedule_names_limits_on_the_todos_it_makes(db):
    _make("limited", limits=["openai"])
    schedules.run_due_schedules(lookahead=60)
    [todo] = Todo.objects.all()
    assert todo.limits == ["openai"]
