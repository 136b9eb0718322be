"""Scheduled todos and priorities in the queue (issue 12): every new row of SPEC's state table, the claim
order, and the refusals. Rows are aged with the database's clock, as the other queue tests do."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections
from django.db.models.functions import Now

from todos import longpoll, queue
from todos.errors import InvalidTransitionInput, TodoConflict
from todos.limits import MAX_DELAY_SECONDS
from todos.models import Todo, TodoState

LATER = timedelta(hours=1)


def _due(todo: Todo) -> Todo:
    """Make a scheduled todo's run_at come (a second ago), as time passing would."""
    Todo.objects.filter(pk=todo.pk).update(run_at=Now() - timedelta(seconds=1))
    todo.refresh_from_db()
    return todo


# --- schedule: -> scheduled ------------------------------------------------------------------------


def test_create_with_a_future_run_at_is_scheduled_and_shows_it(make_todo):
    at = datetime.now(UTC) + LATER
    todo = make_todo("q", run_at=at)
    assert todo.state == TodoState.SCHEDULED
    assert abs((todo.run_at - at).total_seconds()) < 1e-3


def test_create_with_a_delay_is_scheduled_that_far_ahead_by_the_database_clock(make_todo):
    todo = make_todo("q", delay_seconds=90)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert todo.state == TodoState.SCHEDULED
    assert todo.run_at == now + timedelta(seconds=90)


def test_a_plain_create_runs_at_its_creation_time(make_todo):
    todo = make_todo("q")
    assert todo.state == TodoState.PENDING and todo.run_at == todo.created_at and todo.priority == 0


@pytest.mark.parametrize("when", ["delay 0", "run_at in the past"])
def test_a_create_that_is_due_already_is_pending(make_todo, when):
    kwargs = {"delay_seconds": 0} if when == "delay 0" else {"run_at": datetime.now(UTC) - LATER}
    assert make_todo("q", **kwargs).state == TodoState.PENDING


def test_a_scheduled_todo_is_invisible_to_claims_until_due(agent, make_todo):
    todo = make_todo("q", delay_seconds=3600)
    assert queue.claim_next(agent=agent) == []
    with pytest.raises(TodoConflict) as refused:
        queue.claim(todo.id, agent=agent)
    assert refused.value.state == TodoState.SCHEDULED


def test_a_due_scheduled_todo_is_claimed_by_the_claim_scan_before_the_reaper_sees_it(agent, make_todo):
    todo = _due(make_todo("q", delay_seconds=3600))
    assert todo.state == TodoState.SCHEDULED
    [claimed] = queue.claim_next(agent=agent)
    assert claimed.id == todo.id and claimed.state == TodoState.CLAIMED and claimed.attempt == 1


def test_a_due_scheduled_todo_can_be_claimed_by_id(agent, make_todo):
    todo = _due(make_todo("q", delay_seconds=3600))
    assert queue.claim(todo.id, agent=agent).state == TodoState.CLAIMED


def test_a_due_scheduled_todo_assigned_to_another_agent_is_not_claimed(make_agent, make_todo):
    alice, bob = make_agent("alice"), make_agent("bob")
    _due(make_todo("q", delay_seconds=3600, assignee="bob"))
    assert queue.claim_next(agent=alice) == []
    assert len(queue.claim_next(agent=bob)) == 1


def test_the_reaper_promotes_due_scheduled_todos_only_and_counts_them(make_todo):
    due = [_due(make_todo("q", delay_seconds=3600)) for _ in range(3)]
    later = make_todo("q", delay_seconds=3600)
    result = queue.reap_once(batch=2)
    assert result.scheduled_promoted == 3 and result.total == 3
    states = dict(Todo.objects.values_list("id", "state"))
    assert {states[t.id] for t in due} == {TodoState.PENDING}
    assert states[later.id] == TodoState.SCHEDULED
    assert queue.reap_once(batch=2).scheduled_promoted == 0


def test_a_promoted_todo_keeps_its_run_at_and_place_in_line(agent, make_todo):
    todo = _due(make_todo("q", delay_seconds=3600))
    queue.reap_once(batch=10)
    todo_after = Todo.objects.get(pk=todo.pk)
    assert todo_after.state == TodoState.PENDING and todo_after.run_at == todo.run_at


def test_a_duplicate_of_a_scheduled_todo_returns_it(make_todo):
    first, created = queue.create(queue="q", idempotency_key="k", delay_seconds=3600)
    again, created_again = queue.create(queue="q", idempotency_key="k")
    assert created and not created_again and again.id == first.id and again.state == TodoState.SCHEDULED


# --- operator: run now, priority, discard -----------------------------------------------------------


def test_run_now_makes_a_scheduled_todo_claimable_at_once_and_records_who(agent, make_todo):
    todo = make_todo("q", delay_seconds=3600)
    ran = queue.run_now(todo.id, operator="ops")
    assert ran.state == TodoState.PENDING and ran.run_at < todo.run_at
    assert ran.errors[-1]["error"] == "operator run now" and ran.errors[-1]["operator"] == "ops"
    assert [t.id for t in queue.claim_next(agent=agent)] == [todo.id]


def test_run_now_of_a_todo_that_is_not_scheduled_is_a_conflict(make_todo):
    with pytest.raises(TodoConflict) as refused:
        queue.run_now(make_todo("q").id, operator="ops")
    assert refused.value.state == TodoState.PENDING


@pytest.mark.parametrize("schedule", [False, True])
def test_set_priority_changes_a_pending_or_scheduled_todo(make_todo, schedule):
    todo = make_todo("q", **({"delay_seconds": 60} if schedule else {}))
    assert queue.set_priority(todo.id, priority=-7).priority == -7


def test_set_priority_of_a_claimed_todo_is_a_conflict(agent, make_todo):
    make_todo("q")
    [claimed] = queue.claim_next(agent=agent)
    with pytest.raises(TodoConflict) as refused:
        queue.set_priority(claimed.id, priority=5)
    assert refused.value.state == TodoState.CLAIMED
    assert Todo.objects.get(pk=claimed.pk).priority == 0


def test_discard_finishes_a_scheduled_todo(make_todo):
    todo = queue.discard(make_todo("q", delay_seconds=60).id, operator="ops", reason="not needed")
    assert todo.state == TodoState.DONE and todo.result == {"discarded_by": "ops", "reason": "not needed"}


# --- claim order ----------------------------------------------------------------------------------


def test_claims_take_priority_first_then_time_within_one_queue(agent, make_todo):
    old_low = make_todo("q", priority=5, created_at=Now() - timedelta(minutes=9))
    new_urgent = make_todo("q", priority=-10, created_at=Now() - timedelta(minutes=1))
    old_normal = make_todo("q", created_at=Now() - timedelta(minutes=8))
    new_normal = make_todo("q", created_at=Now() - timedelta(minutes=2))
    order = [queue.claim_next(agent=agent)[0].id for _ in range(4)]
    assert order == [new_urgent.id, old_normal.id, new_normal.id, old_low.id]


def test_claims_take_priority_first_across_two_queues(agent, make_todo):
    a_normal = make_todo("a", created_at=Now() - timedelta(minutes=9))
    b_urgent = make_todo("b", priority=-1, created_at=Now() - timedelta(minutes=1))
    b_normal = make_todo("b", created_at=Now() - timedelta(minutes=5))
    a_low = make_todo("a", priority=100, created_at=Now() - timedelta(minutes=20))
    order = [queue.claim_next(agent=agent, queues=["a", "b"])[0].id for _ in range(4)]
    assert order == [b_urgent.id, a_normal.id, b_normal.id, a_low.id]


def test_a_batch_claim_honours_priority_across_queues(agent, make_todo):
    low = [make_todo("a", priority=50, created_at=Now() - timedelta(minutes=10 - i)) for i in range(3)]
    high = [make_todo("b", priority=-50, created_at=Now() - timedelta(minutes=5 - i)) for i in range(3)]
    got = queue.claim_next(agent=agent, limit=4)
    assert [t.id for t in got] == [*(t.id for t in high), low[0].id]


def test_a_due_scheduled_todo_competes_on_priority_with_pending_ones(agent, make_todo):
    pending = make_todo("q", created_at=Now() - timedelta(minutes=5))
    urgent = _due(make_todo("q", delay_seconds=3600, priority=-1))
    got = queue.claim_next(agent=agent, limit=2)
    assert [t.id for t in got] == [urgent.id, pending.id]


# --- refusals: the field named, nothing written -----------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"priority": True}, "priority"),
        ({"delay_seconds": -1}, "delay_seconds"),
        ({"delay_seconds": MAX_DELAY_SECONDS + 1}, "delay_seconds"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at"),  # naive: in whose zone?
        ({"run_at": datetime.now(UTC), "delay_seconds": 5}, "run_at"),
    ],
)
def test_create_refuses_bad_scheduling_input_naming_the_field(db, kwargs, field):
    with pytest.raises(InvalidTransitionInput) as refused:
        queue.create(queue="q", **kwargs)
    assert field in refused.value.extra["fields"]
    assert not Todo.objects.exists()


def test_set_priority_refuses_out_of_range_and_changes_nothing(make_todo):
    todo = make_todo("q")
    with pytest.raises(InvalidTransitionInput):
        queue.set_priority(todo.id, priority=1000)
    assert Todo.objects.get(pk=todo.pk).priority == 0


def test_the_database_refuses_a_priority_out_of_range(make_todo):
    from django.db import IntegrityError, transaction

    todo = make_todo("q")
    with pytest.raises(IntegrityError), transaction.atomic():
        Todo.objects.filter(pk=todo.pk).update(priority=500)


# --- the long-poll wakes at run_at -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_wakes_when_a_todo_scheduled_during_the_wait_comes_due(make_agent):
    agent = make_agent("waiter")
    queue.create(queue="q", title="register the queue")
    queue.claim_next(agent=agent)  # the queue exists and is empty
    got: list[list[Todo]] = []
    started = time.monotonic()
    waiter = threading.Thread(
        target=lambda: (
            got.append(async_to_sync(longpoll.claim_next_waiting)(agent=agent, queues=["q"], wait_seconds=15)),
            connections.close_all(),
        )
    )
    waiter.start()
    time.sleep(0.5)  # the waiter is waiting on an empty queue
    scheduled, _ = queue.create(queue="q", delay_seconds=1.5)
    waiter.join(20)
    waited = time.monotonic() - started
    assert got and [t.id for t in got[0]] == [scheduled.id]
    # Not claimed before its time, and woken by the due time (not the 15 s wait's end). No reaper runs.
    assert 1.9 <= waited < 12, f"waited {waited:.1f}s"
