"""Every door of todos/queue/ is counted in switchboard_todo_transitions_total, the operator's batch
doors included: an admin batch action moves the counter once per todo."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from todos import queue
from todos.metrics import counted, counted_batch
from todos.models import Todo, TodoState


def _count(verb: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("switchboard_todo_transitions_total", {"verb": verb, "outcome": outcome}) or 0.0


def test_an_admin_batch_discard_counts_each_todo_it_moves_and_each_it_skips(admin_client, make_todo):
    pending = [make_todo("q") for _ in range(3)]
    claimed = make_todo("q", state=TodoState.CLAIMED)
    ok, skipped = _count("discard", "ok"), _count("discard", "skipped")
    response = admin_client.post(
        reverse("admin:todos_todo_changelist"),
        {
            "action": "discard",
            "_selected_action": [t.pk for t in [*pending, claimed]],
            "index": 0,
            "select_across": 0,
            "confirm": "yes",
        },
    )
    assert response.status_code in (200, 302)
    assert Todo.objects.filter(state=TodoState.DONE).count() == 3
    assert _count("discard", "ok") - ok == 3
    assert _count("discard", "skipped") - skipped == 1


@pytest.mark.parametrize(
    ("door", "verb", "state", "extra"),
    [
        (queue.force_release_many, "force_release", TodoState.CLAIMED, {}),
        (queue.retry_now_many, "retry_now", TodoState.FAILED, {"next_retry_at_hours": 1}),
        (queue.retry_dead_letter_many, "retry_dead_letter", TodoState.FAILED, {"mode": "reset"}),
    ],
)
def test_each_operator_batch_door_counts_once_per_todo_it_moves(make_todo, door, verb, state, extra):
    hours = extra.pop("next_retry_at_hours", None)
    fields = {"state": state, "attempt": 5, "max_attempts": 5}
    if hours is not None:
        fields["next_retry_at"] = Now() + timedelta(hours=hours)
    todos = [make_todo("q", **fields) for _ in range(2)]
    before = _count(verb, "ok")
    moved = door([t.pk for t in todos], operator="ops", **extra)
    assert len(moved) == 2
    assert _count(verb, "ok") - before == 2


def test_a_single_operator_door_counts_once_not_twice(make_todo):
    todo = make_todo("q")
    before = _count("discard", "ok")
    queue.discard(todo.pk, operator="ops")
    assert _count("discard", "ok") - before == 1


# The doors that count in their own way rather than through @counted or @counted_batch, and why.
COUNTED_INSIDE = {
    "complete_many": "one complete per item, by its outcome",
    "requeue_lapsed": "switchboard_lease_lapses, per row",
    "promote_due_retries": "retry_due, per row",
    "promote_due_scheduled": "scheduled_due, per row",
    "reap_once": "the sweeps it runs, each counting itself",
    "create_many": "create, per item (ok or duplicate), or once with the error that refused the batch",
    "resolve_events": "resolve, per todo an event resolved",
    "time_out_waits": "wait_timeout, per row",
    "resume_cascades": "cascade_cancel, per todo a cascade cancelled",
    "remind_people": "people_reminded, per row",
    "escalate_people": "people_escalated, per row",
    "expire_unstarted": "expire, per row",
}


def test_every_public_door_of_the_queue_is_counted():
    doors = {
        name: function for name, function in inspect.getmembers(queue, inspect.isfunction) if name in queue.__all__
    }
    assert set(COUNTED_INSIDE) <= set(doors), "a door named here is gone: drop it from COUNTED_INSIDE"
    uncounted = sorted(name for name, door in doors.items() if name not in COUNTED_INSIDE and not _counted(door))
    assert uncounted == [], f"not counted in switchboard_todo_transitions_total: {uncounted}"


def _counted(function: object) -> bool:
    # @counted and @counted_batch wrap the door (functools.wraps); the wrapper is theirs.
    wrapped = getattr(function, "__wrapped__", None)
    return wrapped is not None and getattr(function, "__code__", None) in _COUNTING_WRAPPERS


_COUNTING_WRAPPERS = {counted("probe")(lambda: None).__code__, counted_batch("probe")(lambda ids: ids).__code__}


@pytest.mark.parametrize(
    ("door", "verb", "state", "extra"),
    [
        (queue.run_now_many, "run_now", TodoState.SCHEDULED, {"operator": "ops"}),
        (queue.set_priority_many, "set_priority", TodoState.PENDING, {"priority": 3}),
    ],
)
def test_the_admins_run_now_and_priority_batches_count_each_todo(make_todo, door, verb, state, extra):
    fields = {"run_at": timezone.now() + timedelta(hours=1)} if state == TodoState.SCHEDULED else {}
    todos = [make_todo("q", state=state, **fields) for _ in range(2)]
    skipped = make_todo("q", state=TodoState.DONE)
    before_ok, before_skipped = _count(verb, "ok"), _count(verb, "skipped")
    moved = door([t.pk for t in [*todos, skipped]], **extra)
    assert len(moved) == 2
    assert _count(verb, "ok") - before_ok == 2
    assert _count(verb, "skipped") - before_skipped == 1


def test_a_single_run_now_counts_once_not_twice(make_todo):
    todo = make_todo("q", state=TodoState.SCHEDULED, run_at=timezone.now() + timedelta(hours=1))
    before = _count("run_now", "ok")
    queue.run_now(todo.pk, operator="ops")
    assert _count("run_now", "ok") - before == 1
