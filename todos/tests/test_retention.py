"""manage.py purge and todos.retention: what is old goes, in batches; what is recent or can still
run stays; --dry-run counts and deletes nothing."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from events.models import Event
from todos import retention
from todos.management.commands.reap_leases import Command as Reaper
from todos.models import Todo, TodoState


def _ago(days: float):
    return Now() - timedelta(days=days)


def _event(days_old: float, name: str) -> Event:
    event = Event.objects.create(source="gh", type="push", delivery_id=name)
    Event.objects.filter(pk=event.pk).update(received_at=_ago(days_old))
    return event


@pytest.fixture
def history(make_todo):
    """Rows on both sides of the windows (done: 7 days, dead: 90 days)."""
    old_event_emptied = _event(10, "emptied")  # its only todo is old and done: goes with it
    old_event_live = _event(10, "live")  # still has a pending todo: stays
    old_event_bare = _event(10, "bare")  # never had a todo: goes
    recent_event_bare = _event(1, "recent")  # too recent: stays
    rows = {
        "old_done": [make_todo("r", state=TodoState.DONE, completed_at=_ago(8)) for _ in range(5)],
        "old_done_with_event": [
            make_todo("r", state=TodoState.DONE, completed_at=_ago(8), event_id=old_event_emptied.id)
        ],
        "recent_done": [make_todo("r", state=TodoState.DONE, completed_at=_ago(6)) for _ in range(2)],
        "old_dead": [make_todo("r", state=TodoState.FAILED, updated_at=_ago(91)) for _ in range(3)],
        "recent_dead": [make_todo("r", state=TodoState.FAILED, updated_at=_ago(30))],
        # Old, but can still run: never purged, whatever their age.
        "old_retry_waiting": [
            make_todo("r", state=TodoState.FAILED, next_retry_at=Now() + timedelta(hours=1), updated_at=_ago(200))
        ],
        "old_pending": [
            make_todo("r", created_at=_ago(300), updated_at=_ago(300), event_id=old_event_live.id) for _ in range(2)
        ],
        "old_claimed": [make_todo("r", state=TodoState.CLAIMED, updated_at=_ago(300))],
    }
    events = {
        "gone": {old_event_emptied.id, old_event_bare.id},
        "kept": {old_event_live.id, recent_event_bare.id},
    }
    return rows, events


def _ids(rows, *kinds):
    return {t.id for kind in kinds for t in rows[kind]}


def test_purge_dry_run_counts_and_deletes_nothing(history):
    del history  # the rows exist; this test only counts them
    before = (Todo.objects.count(), Event.objects.count())
    result = retention.purge(done_days=7, dead_days=90, dry_run=True)
    assert (result.done, result.dead, result.events) == (6, 3, 2)
    assert (Todo.objects.count(), Event.objects.count()) == before


def test_purge_deletes_exactly_the_old_rows_in_batches(history):
    rows, events = history
    with CaptureQueriesContext(connection) as queries:
        result = retention.purge(done_days=7, dead_days=90, batch=2)
    assert (result.done, result.dead, result.events) == (6, 3, 2)
    remaining = set(Todo.objects.values_list("id", flat=True))
    assert remaining == _ids(rows, "recent_done", "recent_dead", "old_retry_waiting", "old_pending", "old_claimed")
    assert set(Event.objects.values_list("id", flat=True)) == events["kept"]
    deletes = [q["sql"] for q in queries.captured_queries if "DELETE FROM todos_todo" in q["sql"]]
    # 6 done in batches of 2: 2+2+2, then an empty one to be sure; 3 dead: 2+1; no cancelled: one empty.
    assert len(deletes) == 4 + 2 + 1
    assert all("LIMIT 2" in q and "SKIP LOCKED" in q for q in deletes)


def test_purge_again_finds_nothing(history):
    retention.purge(done_days=7, dead_days=90)
    assert retention.purge(done_days=7, dead_days=90).total == 0


def test_purge_command_prints_what_it_removed_and_flags_override_settings(history, settings, capsys):
    rows, _ = history
    settings.RETENTION_DONE_DAYS = 1000  # the flags below override these
    settings.RETENTION_DEAD_DAYS = 1000
    call_command("purge", "--done-days", "7", "--dead-days", "90", "--dry-run")
    out = capsys.readouterr().out
    assert "done todos older than 7 days: would delete 6" in out
    assert "dead-letters older than 90 days: would delete 3" in out
    assert "with no todo left: would delete 2" in out
    assert Todo.objects.filter(id__in=_ids(rows, "old_done")).count() == 5

    call_command("purge", "--dead-days", "20", "--batch", "3")  # done window from settings: 1000 days
    out = capsys.readouterr().out
    assert "done todos older than 1000 days: deleted 0" in out
    assert "dead-letters older than 20 days: deleted 4" in out
    assert Todo.objects.filter(id__in=_ids(rows, "old_done")).count() == 5


def test_purge_skips_a_dead_letter_an_operator_just_retried(make_todo):
    todo = make_todo("r", state=TodoState.FAILED, updated_at=_ago(100))
    Todo.objects.filter(pk=todo.pk).update(state=TodoState.PENDING)  # as retry_dead_letter leaves it
    assert retention.purge(done_days=7, dead_days=90).dead == 0
    assert Todo.objects.filter(pk=todo.pk).exists()


def test_claim_daily_purge_is_granted_once_per_day(db):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos_maintenance")
    assert retention.claim_daily_purge() is not None
    assert retention.claim_daily_purge() is None
    with connection.cursor() as cursor:
        cursor.execute("UPDATE todos_maintenance SET last_started_at = now() - interval '25 hours'")
    assert retention.claim_daily_purge() is not None


def _age_maintenance(task: str, hours: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos_maintenance SET last_started_at = last_started_at - make_interval(hours => %s)"
            " WHERE task = %s",
            [hours, task],
        )


def test_a_daily_purge_that_was_stopped_does_not_spend_the_day(db):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos_maintenance")
    started = retention.claim_daily_purge()
    assert started is not None
    assert retention.run_daily_purge(started, should_stop=lambda: True).stopped
    assert retention.claim_daily_purge() is None  # the attempt is recent: no second purger at once
    _age_maintenance("purge", 2)  # the attempt is older than the retry period, the day not over
    assert retention.claim_daily_purge() is not None


def test_a_daily_purge_that_finished_spends_the_day(db):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos_maintenance")
    started = retention.claim_daily_purge()
    assert started is not None
    assert not retention.run_daily_purge(started).stopped
    _age_maintenance("purge", 2)
    assert retention.claim_daily_purge() is None
    _age_maintenance("purge", 23)
    _age_maintenance("purge:done", 25)
    assert retention.claim_daily_purge() is not None


@pytest.mark.django_db(transaction=True)
def test_only_one_of_several_reapers_purges_on_a_day(settings, make_todo):
    settings.PURGE_DAILY = True
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos_maintenance")
    old = make_todo("r", state=TodoState.DONE, completed_at=_ago(30))
    reapers = [Reaper() for _ in range(4)]
    barrier = threading.Barrier(len(reapers))

    def start(reaper: Reaper) -> None:
        barrier.wait()
        try:
            reaper.maybe_start_purge()
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(r,)) for r in reapers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    purgers = [r.purger for r in reapers if r.purger is not None]
    assert len(purgers) == 1
    purgers[0].join(timeout=30)
    assert not Todo.objects.filter(pk=old.pk).exists()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos_maintenance")


def test_purge_deletes_cancelled_todos_past_their_own_window(make_todo, capsys):
    old = make_todo("r", state=TodoState.CANCELLED, completed_at=_ago(8))
    recent = make_todo("r", state=TodoState.CANCELLED, completed_at=_ago(2))
    assert retention.purge(cancelled_days=7, dry_run=True).cancelled == 1
    call_command("purge", "--cancelled-days", "7")
    assert "cancelled todos older than 7 days: deleted 1" in capsys.readouterr().out
    assert set(Todo.objects.values_list("id", flat=True)) == {recent.id}
    assert not Todo.objects.filter(pk=old.pk).exists()
