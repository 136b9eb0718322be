"""Queue controls in the claim statement (todos/controls.py, CLAIM_NEXT's _queue_quotas), one claim at a
time: pause, max_claimed, the token bucket, and bad values. Concurrency: test_controls_concurrency.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from todos import controls, queue, selectors
from todos.errors import InvalidTransitionInput, QueueNotFound, TodoConflict
from todos.models import Queue, Todo, TodoState

pytestmark = pytest.mark.django_db


def test_a_paused_queue_hands_out_nothing_and_resume_hands_out_again(agent, make_todo):
    make_todo("jobs")
    controls.pause("jobs")
    assert queue.claim_next(agent=agent) == []
    controls.resume("jobs")
    assert len(queue.claim_next(agent=agent)) == 1


def test_pause_leaves_other_queues_claimable(agent, make_todo):
    make_todo("jobs")
    other = make_todo("other")
    controls.pause("jobs")
    assert [t.id for t in queue.claim_next(agent=agent, limit=5)] == [other.id]


def test_creates_still_land_in_a_paused_queue(agent, make_todo):
    make_todo("jobs")
    controls.pause("jobs")
    todo, created = queue.create(queue="jobs", agent=agent, title="new")
    assert created and todo.state == TodoState.PENDING


def test_claim_one_in_a_paused_queue_is_a_conflict_saying_so(agent, make_todo):
    todo = make_todo("jobs")
    controls.pause("jobs")
    with pytest.raises(TodoConflict) as caught:
        queue.claim(todo.id, agent=agent)
    assert caught.value.extra["reason"] == "queue_paused"
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING


def test_max_claimed_caps_live_leases(agent, make_todo):
    for _ in range(5):
        make_todo("jobs")
    controls.set_limits("jobs", max_claimed=2)
    assert len(queue.claim_next(agent=agent, limit=10)) == 2
    assert queue.claim_next(agent=agent) == []


def test_a_completed_lease_frees_its_slot(agent, make_todo):
    for _ in range(3):
        make_todo("jobs")
    controls.set_limits("jobs", max_claimed=1)
    [first] = queue.claim_next(agent=agent)
    queue.complete(first.id, agent=agent, lease_id=first.lease_id)
    assert len(queue.claim_next(agent=agent)) == 1


def test_a_lapsed_lease_does_not_count_against_max_claimed(agent, make_todo):
    make_todo("jobs", state=TodoState.CLAIMED, lease_expires_at=Now() - timedelta(seconds=1), attempt=1)
    fresh = make_todo("jobs")
    controls.set_limits("jobs", max_claimed=1)
    claimed = queue.claim_next(agent=agent, limit=1)
    assert len(claimed) == 1
    assert queue.claim_next(agent=agent) == []
    assert fresh.id in {t.id for t in claimed} or Todo.objects.get(pk=fresh.id).state == TodoState.PENDING


def test_max_claimed_zero_hands_out_nothing(agent, make_todo):
    make_todo("jobs")
    controls.set_limits("jobs", max_claimed=0)
    assert queue.claim_next(agent=agent) == []


def test_max_claimed_null_removes_the_cap(agent, make_todo):
    for _ in range(3):
        make_todo("jobs")
    controls.set_limits("jobs", max_claimed=1)
    controls.set_limits("jobs", max_claimed=None)
    assert len(queue.claim_next(agent=agent, limit=3)) == 3


def test_a_batch_claim_across_queues_takes_at_most_the_limited_queues_quota(agent, make_todo):
    for _ in range(4):
        make_todo("capped")
        make_todo("free")
    controls.set_limits("capped", max_claimed=1)
    claimed = queue.claim_next(agent=agent, limit=8)
    assert sorted(t.queue for t in claimed) == ["capped"] + ["free"] * 4


def test_the_rate_limit_takes_the_burst_then_nothing_until_a_token_refills(agent, make_todo):
    for _ in range(10):
        make_todo("jobs")
    controls.set_limits("jobs", rate_per_second=0.001, rate_burst=3)
    assert len(queue.claim_next(agent=agent, limit=10)) == 3
    assert queue.claim_next(agent=agent) == []
    row = Queue.objects.get(name="jobs")
    assert row.tokens is not None and row.tokens < 1


def test_the_bucket_refills_with_time(agent, make_todo):
    for _ in range(10):
        make_todo("jobs")
    controls.set_limits("jobs", rate_per_second=1, rate_burst=2)
    assert len(queue.claim_next(agent=agent, limit=10)) == 2
    # Age the bucket by 5 s rather than sleeping: it refills to its burst (2), never beyond.
    Queue.objects.filter(name="jobs").update(refilled_at=Now() - timedelta(seconds=5))
    assert len(queue.claim_next(agent=agent, limit=10)) == 2


def test_the_burst_defaults_to_one_seconds_worth(make_todo):
    make_todo("jobs")
    assert controls.set_limits("jobs", rate_per_second=7.5).rate_burst == 8
    assert controls.set_limits("jobs", rate_per_second=0.2).rate_burst == 8  # kept once set
    assert controls.set_limits("jobs", rate_per_second=None).rate_burst is None


def test_a_claim_that_takes_nothing_leaves_the_bucket_alone(agent, make_todo):
    make_todo("jobs")
    controls.set_limits("jobs", rate_per_second=1, rate_burst=5)
    before = Queue.objects.get(name="jobs")
    queue.claim_next(agent=agent, queues=["jobs"])
    queue.claim_next(agent=agent, queues=["jobs"])  # nothing left: no write
    after = Queue.objects.get(name="jobs")
    assert after.tokens == pytest.approx(before.tokens - 1, abs=0.01)


def test_an_unknown_queue_is_not_found(db):
    with pytest.raises(QueueNotFound):
        controls.pause("nope")
    with pytest.raises(QueueNotFound):
        controls.set_limits("nope", max_claimed=1)


def test_a_queue_outside_the_agents_scopes_is_not_found(make_agent, make_todo):
    make_todo("jobs")
    outsider = make_agent("bob", claim=["other.*"])
    with pytest.raises(QueueNotFound):
        controls.pause("jobs", agent=outsider)
    assert not Queue.objects.get(name="jobs").paused


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_claimed", -1),
        ("max_claimed", 10**9),
        ("max_claimed", 1.5),
        ("rate_per_second", 0),
        ("rate_per_second", -2),
        ("rate_per_second", float("inf")),
        ("rate_burst", 0),
    ],
)
def test_bad_values_name_the_field_and_change_nothing(make_todo, field, value):
    make_todo("jobs")
    with pytest.raises(InvalidTransitionInput) as caught:
        controls.set_limits("jobs", **{field: value, **({"rate_per_second": 1} if field == "rate_burst" else {})})
    assert field in caught.value.extra["fields"]
    row = Queue.objects.get(name="jobs")
    assert (row.max_claimed, row.rate_per_second, row.rate_burst) == (None, None, None)


def test_a_burst_without_a_rate_is_refused(make_todo):
    make_todo("jobs")
    with pytest.raises(InvalidTransitionInput) as caught:
        controls.set_limits("jobs", rate_burst=5)
    assert "rate_burst" in caught.value.extra["fields"]


def test_queue_stats_show_paused_and_the_limits(agent, make_todo):
    make_todo("jobs")
    controls.pause("jobs")
    controls.set_limits("jobs", max_claimed=3, rate_per_second=2, rate_burst=4)
    [stats] = selectors.queue_stats()
    assert (stats.paused, stats.max_claimed, stats.rate_per_second, stats.rate_burst) == (True, 3, 2.0, 4)


def test_a_long_poll_on_a_paused_queue_is_not_woken_early_by_its_lapsed_leases(agent, make_todo):
    make_todo("jobs", state=TodoState.CLAIMED, lease_expires_at=Now() - timedelta(seconds=1), attempt=1)
    controls.pause("jobs")
    assert selectors.seconds_until_claimable(agent) is None


def test_a_long_poll_refused_by_the_rate_wakes_when_the_next_token_is_due(agent, make_todo):
    for _ in range(3):
        make_todo("jobs")
    controls.set_limits("jobs", rate_per_second=0.5, rate_burst=1)
    assert len(queue.claim_next(agent=agent)) == 1
    due = selectors.seconds_until_claimable(agent)
    assert due is not None and 1.0 < due <= 2.0


def test_a_long_poll_refused_by_max_claimed_polls_again(agent, make_todo):
    for _ in range(2):
        make_todo("jobs")
    controls.set_limits("jobs", max_claimed=1)
    queue.claim_next(agent=agent, lease_seconds=600)
    due = selectors.seconds_until_claimable(agent)
    assert due is not None and due <= 0


def _lapse(todo: Todo) -> None:
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now() - timedelta(seconds=1))


def _live_leases() -> int:
    return Todo.objects.filter(state=TodoState.CLAIMED, lease_expires_at__gte=Now()).count()


def test_a_heartbeat_does_not_take_back_a_lapsed_lease_past_max_claimed(make_agent, make_todo):
    slow, fast = make_agent("slow"), make_agent("fast")
    first, second = make_todo("jobs"), make_todo("jobs")
    controls.set_limits("jobs", max_claimed=1)
    late = queue.claim(first.id, agent=slow)
    _lapse(late)
    held = queue.claim(second.id, agent=fast)  # the lapsed lease freed the one slot
    with pytest.raises(TodoConflict) as caught:
        queue.heartbeat(late.id, agent=slow, lease_id=late.lease_id)
    assert caught.value.extra["reason"] == "queue_limit"
    assert _live_leases() == 1
    # The slot's own holder heartbeats as ever; once it is done, the lapsed lease may be taken back.
    queue.heartbeat(held.id, agent=fast, lease_id=held.lease_id)
    queue.complete(held.id, agent=fast, lease_id=held.lease_id)
    assert queue.heartbeat(late.id, agent=slow, lease_id=late.lease_id).state == TodoState.CLAIMED
    assert _live_leases() == 1


def test_a_heartbeat_does_not_take_back_a_requeued_lease_past_max_claimed(make_agent, make_todo):
    slow = make_agent("slow")
    make_todo("jobs")
    controls.set_limits("jobs", max_claimed=1)
    [late] = queue.claim_next(agent=slow)
    _lapse(late)
    queue.requeue_lapsed(batch=10)  # the reaper: back to pending, the receipt kept
    make_todo("jobs", state=TodoState.CLAIMED, owner="fast", attempt=1)  # the slot, taken meanwhile
    with pytest.raises(TodoConflict) as caught:
        queue.heartbeat(late.id, agent=slow, lease_id=late.lease_id)
    assert caught.value.extra["reason"] == "queue_limit"
    assert Todo.objects.get(pk=late.pk).state == TodoState.PENDING
    assert _live_leases() == 1


def test_a_heartbeat_does_not_take_back_a_lapsed_lease_in_a_paused_queue(agent, make_todo):
    make_todo("jobs")
    [late] = queue.claim_next(agent=agent)
    _lapse(late)
    controls.pause("jobs")
    with pytest.raises(TodoConflict) as caught:
        queue.heartbeat(late.id, agent=agent, lease_id=late.lease_id)
    assert caught.value.extra["reason"] == "queue_paused"
    assert _live_leases() == 0
    controls.resume("jobs")
    assert queue.heartbeat(late.id, agent=agent, lease_id=late.lease_id).state == TodoState.CLAIMED


def test_a_live_lease_still_heartbeats_in_a_paused_or_full_queue(agent, make_todo):
    make_todo("jobs")
    [held] = queue.claim_next(agent=agent)
    controls.set_limits("jobs", max_claimed=1)
    controls.pause("jobs")
    extended = queue.heartbeat(held.id, agent=agent, lease_id=held.lease_id, lease_seconds=600)
    assert extended.lease_expires_at > held.lease_expires_at
