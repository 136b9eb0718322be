"""The operator transitions behind the admin's actions: retry now, discard, force-release."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from todos import queue
from todos.errors import TodoConflict, TodoNotFound
from todos.models import Todo, TodoState


def test_retry_now_makes_a_retry_waiting_todo_pending_at_once(make_todo):
    todo = make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() + timedelta(hours=1))
    queue.retry_now(todo.id, operator="ops")
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING
    assert todo.next_retry_at is None
    assert todo.attempt == 1
    assert todo.errors[-1]["error"] == "operator retry now"
    assert todo.errors[-1]["operator"] == "ops"


def test_retry_now_of_a_dead_letter_is_conflict(make_todo):
    todo = make_todo("q", state=TodoState.FAILED, attempt=5, next_retry_at=None)
    with pytest.raises(TodoConflict) as exc:
        queue.retry_now(todo.id, operator="ops")
    assert exc.value.extra["dead_letter"] is True
    todo.refresh_from_db()
    assert todo.state == TodoState.FAILED and todo.errors == []


def test_retry_now_of_a_missing_todo_is_not_found(db):
    with pytest.raises(TodoNotFound):
        queue.retry_now("td_missing", operator="ops")


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"state": TodoState.FAILED, "attempt": 5, "next_retry_at": None},
        {"state": TodoState.FAILED, "attempt": 1, "next_retry_at": Now() + timedelta(hours=1)},
    ],
    ids=["pending", "dead-letter", "retry-waiting"],
)
def test_discard_finishes_the_todo_with_who_and_why(make_todo, overrides):
    todo = make_todo("q", idempotency_key="k", **overrides)
    queue.discard(todo.id, operator="ops", reason="obsolete")
    todo.refresh_from_db()
    assert todo.state == TodoState.DONE
    assert todo.result == {"discarded_by": "ops", "reason": "obsolete"}
    assert todo.completed_at is not None and todo.next_retry_at is None
    # done frees the key: the same work can be created again
    _, created = queue.create(queue="q", idempotency_key="k")
    assert created


def test_discard_of_a_claimed_todo_is_conflict(agent, make_todo):
    make_todo("q")
    [claimed] = queue.claim_next(agent=agent)
    with pytest.raises(TodoConflict) as exc:
        queue.discard(claimed.id, operator="ops")
    assert exc.value.state == "claimed"
    claimed.refresh_from_db()
    assert claimed.state == TodoState.CLAIMED


def test_discard_of_a_done_todo_is_conflict(make_todo):
    todo = make_todo("q", state=TodoState.DONE, result={"ok": 1})
    with pytest.raises(TodoConflict):
        queue.discard(todo.id, operator="ops")
    todo.refresh_from_db()
    assert todo.result == {"ok": 1}


def test_force_release_returns_a_claim_to_pending_and_voids_the_receipt(agent, make_todo):
    make_todo("q")
    [claimed] = queue.claim_next(agent=agent)
    queue.force_release(claimed.id, operator="ops")
    todo = Todo.objects.get(pk=claimed.id)
    assert todo.state == TodoState.PENDING
    assert todo.lease_id is None and todo.lease_expires_at is None
    assert todo.owner == "alice" and todo.claimed_at == claimed.claimed_at  # last claimed by
    assert todo.attempt == 1  # the receive stays counted, as with a lapse
    assert todo.errors[-1]["error"] == "operator force-release"
    assert todo.errors[-1]["owner"] == "alice"
    with pytest.raises(TodoConflict):
        queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id)


def test_force_release_of_a_pending_todo_is_conflict(make_todo):
    todo = make_todo("q")
    with pytest.raises(TodoConflict) as exc:
        queue.force_release(todo.id, operator="ops")
    assert exc.value.state == "pending"


def test_retry_dead_letter_many_retries_only_the_dead_letters(make_todo):
    dead = [make_todo("q", state=TodoState.FAILED, attempt=5, next_retry_at=None) for _ in range(3)]
    pending = make_todo("q")
    retried = queue.retry_dead_letter_many([*(t.id for t in dead), pending.id], mode="once", operator="ops")
    assert sorted(t.id for t in retried) == sorted(t.id for t in dead)
    for todo in dead:
        todo.refresh_from_db()
        assert todo.state == TodoState.PENDING and todo.max_attempts == 6
        assert todo.errors[-1]["mode"] == "once" and todo.errors[-1]["operator"] == "ops"
    pending.refresh_from_db()
    assert pending.errors == []


def test_retry_dead_letter_many_with_a_taken_key_is_conflict_and_changes_nothing(make_todo):
    free = make_todo("q", state=TodoState.FAILED, attempt=5, next_retry_at=None)
    taken = make_todo("q", idempotency_key="k", state=TodoState.FAILED, attempt=5, next_retry_at=None)
    make_todo("q", idempotency_key="k")
    with pytest.raises(TodoConflict) as exc:
        queue.retry_dead_letter_many([free.id, taken.id], mode="reset", operator="ops")
    assert exc.value.extra["reason"] == "idempotency_key_taken"
    free.refresh_from_db()
    assert free.is_dead_letter


def test_discard_many_and_force_release_many_move_only_what_their_guard_allows(agent, make_todo):
    make_todo("q")
    [claimed] = queue.claim_next(agent=agent)
    pending = make_todo("q")
    assert [t.id for t in queue.discard_many([claimed.id, pending.id], operator="ops")] == [pending.id]
    assert [t.id for t in queue.force_release_many([claimed.id, pending.id], operator="ops")] == [claimed.id]
    assert [t.id for t in queue.retry_now_many([claimed.id, pending.id], operator="ops")] == []
