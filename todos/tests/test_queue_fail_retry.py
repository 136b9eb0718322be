"""fail, backoff, dead-letters, the reaper's sweeps and operator retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.test import override_settings

from todos import queue
from todos.errors import InvalidTransitionInput, TodoConflict
from todos.models import Todo, TodoState


def _claim(agent):
    [todo] = queue.claim_next(agent=agent)
    return todo


def _retry_in(todo: Todo) -> float:
    return (todo.next_retry_at - todo.updated_at).total_seconds()


def test_fail_below_the_cap_schedules_a_retry_and_records_the_error(agent, make_todo):
    make_todo("q")
    todo = _claim(agent)
    failed = queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, error="boom")
    assert failed.state == TodoState.FAILED
    assert failed.next_retry_at is not None
    assert failed.lease_id is None
    assert failed.errors == [{"attempt": 1, "at": failed.errors[0]["at"], "error": "boom"}]
    assert not failed.is_dead_letter


@override_settings(QUEUE_RETRY_BASE_SECONDS=10, QUEUE_RETRY_CAP_SECONDS=25)
def test_fail_backoff_is_full_jitter_below_an_exponential_capped_ceiling(agent, make_todo):
    delays = {1: [], 2: [], 3: []}
    for attempt in delays:
        for _ in range(20):
            make_todo("q", max_attempts=9, attempt=attempt - 1)
            todo = _claim(agent)
            assert todo.attempt == attempt
            delays[attempt].append(_retry_in(queue.fail(todo.id, agent=agent, lease_id=todo.lease_id)))
    assert all(0 <= d <= 10.01 for d in delays[1])
    assert all(0 <= d <= 20.01 for d in delays[2])
    assert all(0 <= d <= 25.01 for d in delays[3])  # capped: 40 > 25
    assert max(delays[2]) > 10  # it does grow
    assert len({round(d, 3) for d in delays[1]}) > 10  # and it is jittered


def test_fail_with_retry_in_uses_that_delay(agent, make_todo):
    make_todo("q")
    todo = _claim(agent)
    failed = queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, retry_in_seconds=120)
    assert abs(_retry_in(failed) - 120) < 1


def test_fail_at_the_cap_dead_letters(agent, make_todo):
    make_todo("q", max_attempts=2, attempt=1)
    todo = _claim(agent)
    failed = queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, error="last")
    assert failed.state == TodoState.FAILED and failed.next_retry_at is None
    assert failed.is_dead_letter
    assert Todo.objects.dead_lettered().count() == 1


def test_a_failed_todo_becomes_claimable_once_its_retry_is_due(agent, make_todo):
    make_todo("q")
    todo = _claim(agent)
    queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, retry_in_seconds=3600)
    assert queue.claim_next(agent=agent) == []
    Todo.objects.filter(pk=todo.pk).update(next_retry_at=Now() - timedelta(seconds=1))
    [again] = queue.claim_next(agent=agent)
    assert again.id == todo.id and again.attempt == 2


def test_promote_due_retries_moves_only_due_ones_to_pending(make_todo):
    due = make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() - timedelta(seconds=1))
    later = make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() + timedelta(hours=1))
    dead = make_todo("q", state=TodoState.FAILED, attempt=5, next_retry_at=None)
    assert queue.promote_due_retries(batch=10) == 1
    for todo, state in ((due, "pending"), (later, "failed"), (dead, "failed")):
        todo.refresh_from_db()
        assert todo.state == state
    due.refresh_from_db()
    assert due.next_retry_at is None


def test_requeue_lapsed_requeues_below_the_cap_and_dead_letters_at_it(make_todo):
    expired = Now() - timedelta(seconds=1)
    below = make_todo("q", state=TodoState.CLAIMED, attempt=1, owner="a", lease_id="ls_1", lease_expires_at=expired)
    at_cap = make_todo("q", state=TodoState.CLAIMED, attempt=5, owner="a", lease_id="ls_2", lease_expires_at=expired)
    live = make_todo(
        "q",
        state=TodoState.CLAIMED,
        attempt=1,
        owner="a",
        lease_id="ls_3",
        lease_expires_at=Now() + timedelta(minutes=5),
    )
    result = queue.requeue_lapsed(batch=10)
    assert (result.requeued, result.dead_lettered) == (1, 1)
    below.refresh_from_db()
    at_cap.refresh_from_db()
    live.refresh_from_db()
    assert below.state == TodoState.PENDING and below.errors[-1]["error"] == "lease expired"
    assert at_cap.is_dead_letter and at_cap.errors[-1] == {
        "attempt": 5,
        "at": at_cap.errors[-1]["at"],
        "error": "lease expired",
    }
    assert live.state == TodoState.CLAIMED


def test_reap_once_drains_in_batches(make_todo):
    for _ in range(7):
        make_todo(
            "q",
            state=TodoState.CLAIMED,
            attempt=1,
            owner="a",
            lease_id="ls",
            lease_expires_at=Now() - timedelta(seconds=1),
        )
    for _ in range(5):
        make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() - timedelta(seconds=1))
    result = queue.reap_once(batch=2)
    assert (result.requeued, result.dead_lettered, result.retries_promoted) == (7, 0, 5)
    assert Todo.objects.filter(state="pending").count() == 12


@pytest.fixture
def dead(make_todo):
    return make_todo(
        "q",
        state=TodoState.FAILED,
        attempt=5,
        max_attempts=5,
        next_retry_at=None,
        errors=[{"attempt": 5, "error": "x"}],
    )


def test_retry_dead_letter_reset_grants_a_new_budget_and_keeps_the_errors(dead):
    todo = queue.retry_dead_letter(dead.id, mode="reset", operator="ops", note="fixed the bug")
    assert (todo.state, todo.attempt, todo.max_attempts) == (TodoState.PENDING, 0, 5)
    assert todo.errors[0] == {"attempt": 5, "error": "x"}
    assert todo.errors[-1]["operator"] == "ops" and todo.errors[-1]["mode"] == "reset"
    assert todo.errors[-1]["note"] == "fixed the bug"


def test_retry_dead_letter_once_grants_exactly_one_more_try(agent, dead):
    todo = queue.retry_dead_letter(dead.id, mode="once", operator="ops")
    assert (todo.attempt, todo.max_attempts) == (5, 6)
    claimed = _claim(agent)
    again = queue.fail(claimed.id, agent=agent, lease_id=claimed.lease_id, error="still broken")
    assert again.is_dead_letter


def test_retry_dead_letter_of_a_todo_that_is_not_dead_is_conflict(make_todo):
    waiting = make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() + timedelta(hours=1))
    with pytest.raises(TodoConflict):
        queue.retry_dead_letter(waiting.id, mode="reset", operator="ops")


def test_retry_dead_letter_when_a_newer_todo_holds_the_key_is_conflict(make_todo):
    old = make_todo("q", idempotency_key="k", state=TodoState.FAILED, attempt=5, next_retry_at=None)
    queue.create(queue="q", idempotency_key="k")
    with pytest.raises(TodoConflict):
        queue.retry_dead_letter(old.id, mode="reset", operator="ops")
    old.refresh_from_db()
    assert old.is_dead_letter


def test_retry_dead_letter_rejects_an_unknown_mode(dead):
    with pytest.raises(InvalidTransitionInput):
        queue.retry_dead_letter(dead.id, mode="twice", operator="ops")
