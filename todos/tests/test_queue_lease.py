"""heartbeat, complete, release, and the receipt rules of SPEC decision 2."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from todos import queue
from todos.errors import TodoConflict, TodoNotFound
from todos.models import Todo, TodoState


def _lapse(todo: Todo) -> None:
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now() - timedelta(seconds=1))


@pytest.fixture
def claimed(agent, make_todo):
    make_todo("q")
    [todo] = queue.claim_next(agent=agent, lease_seconds=60)
    return todo


def test_heartbeat_extends_the_lease(agent, claimed):
    todo = queue.heartbeat(claimed.id, agent=agent, lease_id=claimed.lease_id, lease_seconds=600)
    assert todo.lease_expires_at > claimed.lease_expires_at + timedelta(seconds=500)
    assert todo.state == TodoState.CLAIMED and todo.attempt == 1


def test_complete_marks_done_with_result_and_clears_the_lease(agent, claimed):
    queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id, result={"ok": True})
    claimed.refresh_from_db()
    assert claimed.state == TodoState.DONE
    assert claimed.result == {"ok": True}
    assert claimed.completed_at is not None
    assert claimed.lease_id is None and claimed.lease_expires_at is None


@pytest.mark.parametrize("verb", ["heartbeat", "complete", "fail", "release"])
def test_a_wrong_lease_id_is_conflict_and_changes_nothing(agent, claimed, verb):
    with pytest.raises(TodoConflict) as err:
        getattr(queue, verb)(claimed.id, agent=agent, lease_id="ls_wrong")
    assert err.value.state == "claimed"
    before = claimed.updated_at
    claimed.refresh_from_db()
    assert claimed.state == TodoState.CLAIMED and claimed.updated_at == before


@pytest.mark.parametrize("verb", ["heartbeat", "complete", "fail", "release"])
def test_another_agent_with_the_receipt_is_conflict(make_agent, claimed, verb):
    mallory = make_agent("mallory")
    with pytest.raises(TodoConflict):
        getattr(queue, verb)(claimed.id, agent=mallory, lease_id=claimed.lease_id)
    claimed.refresh_from_db()
    assert claimed.state == TodoState.CLAIMED


@pytest.mark.parametrize("verb", ["heartbeat", "complete", "fail", "release"])
def test_an_agent_outside_the_scope_gets_not_found(make_agent, claimed, verb):
    outsider = make_agent("outsider", claim=["other.*"])
    with pytest.raises(TodoNotFound):
        getattr(queue, verb)(claimed.id, agent=outsider, lease_id=claimed.lease_id)


def test_a_stale_receipt_after_a_reclaim_is_conflict(make_agent, make_todo):
    slow, fast = make_agent("slow"), make_agent("fast")
    make_todo("q")
    [first] = queue.claim_next(agent=slow)
    _lapse(first)
    [second] = queue.claim_next(agent=fast)
    with pytest.raises(TodoConflict):
        queue.complete(first.id, agent=slow, lease_id=first.lease_id)
    queue.complete(second.id, agent=fast, lease_id=second.lease_id, result="fast")
    second.refresh_from_db()
    assert second.state == TodoState.DONE and second.result == "fast"


def test_a_lapsed_lease_not_yet_reclaimed_may_still_be_completed(agent, claimed):
    _lapse(claimed)
    queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id)
    claimed.refresh_from_db()
    assert claimed.state == TodoState.DONE


def test_a_lapsed_lease_swept_by_the_reaper_may_still_be_completed(agent, claimed):
    _lapse(claimed)
    assert queue.reap_once(batch=10).requeued == 1
    queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id)
    claimed.refresh_from_db()
    assert claimed.state == TodoState.DONE


def test_heartbeat_takes_back_a_swept_lease_that_was_not_reclaimed(agent, claimed):
    _lapse(claimed)
    queue.reap_once(batch=10)
    todo = queue.heartbeat(claimed.id, agent=agent, lease_id=claimed.lease_id)
    assert todo.state == TodoState.CLAIMED and todo.attempt == 1


def test_release_returns_the_todo_and_gives_the_attempt_back(agent, claimed):
    queue.release(claimed.id, agent=agent, lease_id=claimed.lease_id)
    claimed.refresh_from_db()
    assert claimed.state == TodoState.PENDING
    assert claimed.attempt == 0
    assert claimed.lease_id is None and claimed.lease_expires_at is None
    [again] = queue.claim_next(agent=agent)
    assert again.id == claimed.id and again.attempt == 1


def test_complete_twice_is_conflict_done(agent, claimed):
    queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id)
    with pytest.raises(TodoConflict) as err:
        queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id)
    assert err.value.state == "done"


def test_complete_many_reports_one_outcome_per_item(make_agent, make_todo):
    alice = make_agent("alice")
    make_todo("q")
    make_todo("q")
    a, b = queue.claim_next(agent=alice, limit=2)
    outcomes = queue.complete_many(
        [(a.id, a.lease_id, {"n": 1}), (b.id, "ls_wrong", None), ("td_missing", "ls_x", None)], agent=alice
    )
    assert isinstance(outcomes[0], Todo) and outcomes[0].result == {"n": 1}
    assert isinstance(outcomes[1], TodoConflict)
    assert isinstance(outcomes[2], TodoNotFound)
    b.refresh_from_db()
    assert b.state == TodoState.CLAIMED


@pytest.fixture
def dead_lettered_by_the_reaper(agent, make_todo):
    make_todo("q", max_attempts=1)
    [todo] = queue.claim_next(agent=agent)
    _lapse(todo)
    assert queue.reap_once(batch=10).dead_lettered == 1
    return todo


@pytest.mark.parametrize("verb", ["heartbeat", "release"])
def test_heartbeat_or_release_of_a_lease_the_reaper_dead_lettered_is_conflict(agent, dead_lettered_by_the_reaper, verb):
    todo = dead_lettered_by_the_reaper
    with pytest.raises(TodoConflict) as err:
        getattr(queue, verb)(todo.id, agent=agent, lease_id=todo.lease_id)
    assert err.value.state == "failed" and err.value.extra["dead_letter"] is True
    todo.refresh_from_db()
    assert todo.is_dead_letter and todo.attempt == 1
    # Still never handed out again (SPEC decision 1).
    assert queue.claim_next(agent=agent) == []


def test_complete_of_a_lease_the_reaper_dead_lettered_is_allowed(agent, dead_lettered_by_the_reaper):
    todo = dead_lettered_by_the_reaper
    queue.complete(todo.id, agent=agent, lease_id=todo.lease_id, result="late but done")
    todo.refresh_from_db()
    assert todo.state == TodoState.DONE and todo.result == "late but done"


def test_release_and_lapse_requeue_leave_the_same_claim_fields(agent, make_todo):
    # The rule (docs/api.md, "How a todo lives"): owner and claimed_at are the last claim's, whatever ended it;
    # only the receipt differs, since a lapsed receipt stays valid until someone re-claims (SPEC decision 2).
    make_todo("q")
    make_todo("q")
    released, lapsed = queue.claim_next(agent=agent, limit=2, worker="w1")
    queue.release(released.id, agent=agent, lease_id=released.lease_id)
    _lapse(lapsed)
    assert queue.reap_once(batch=10).requeued == 1
    rows = {t.id: t for t in Todo.objects.filter(pk__in=[released.id, lapsed.id])}
    for before in (released, lapsed):
        after = rows[before.id]
        assert after.state == TodoState.PENDING
        assert after.owner == "alice/w1"
        assert after.claimed_at == before.claimed_at
    assert rows[released.id].lease_id is None
    assert rows[lapsed.id].lease_id == lapsed.lease_id
