"""Start-by deadlines (issue 31): a todo not claimed by its expires_at is never taken late (a predicate of every
claim) and is cancelled with reason ``expired`` by the reaper; racing claims and the reaper, exactly one wins."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from todos import queue
from todos.errors import TodoConflict
from todos.models import Agent, Todo, TodoState
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_unclaimed_todo_past_its_deadline_is_never_claimed_and_the_reaper_cancels_it(api: Any, agent: Agent) -> None:
    response = api.post("/todos/", {"queue": "jobs", "expire_after_seconds": 0.3})
    assert response.status_code == 201, response.content
    todo = response.json()
    assert todo["expires_at"] is not None
    time.sleep(0.4)
    assert queue.claim_next(agent=agent, queues=["jobs"]) == []
    with pytest.raises(TodoConflict):
        queue.claim(todo["id"], agent=agent)
    assert queue.reap_once(batch=100).expired == 1
    shown = api.get(f"/todos/{todo['id']}/").json()
    assert shown["state"] == "cancelled" and shown["errors"][-1]["reason"] == "expired"


def test_a_todo_claimed_before_its_deadline_has_started_and_never_expires(agent: Agent) -> None:
    queue.create(queue="jobs", expires_at=timezone.now() + timedelta(seconds=0.3))
    [held] = queue.claim_next(agent=agent, queues=["jobs"])
    time.sleep(0.4)
    assert queue.reap_once(batch=100).expired == 0
    queue.release(held.id, agent=agent, lease_id=held.lease_id or "")
    assert len(queue.claim_next(agent=agent, queues=["jobs"])) == 1, "started: a release does not make it expire"


def test_scheduled_and_waiting_todos_expire_too(agent: Agent) -> None:
    scheduled, _ = queue.create(queue="jobs", delay_seconds=3600, expire_after_seconds=0.2)
    dependency, _ = queue.create(queue="other")
    waiting, _ = queue.create(queue="jobs", depends_on=[dependency.id], expire_after_seconds=0.2)
    time.sleep(0.3)
    assert queue.reap_once(batch=100).expired == 2
    assert {t.state for t in Todo.objects.filter(pk__in=[scheduled.id, waiting.id])} == {TodoState.CANCELLED}


def test_expiry_racing_claims_exactly_one_wins(agent: Agent) -> None:
    deadline = timezone.now() + timedelta(seconds=0.4)
    ids = [queue.create(queue="race", expires_at=deadline)[0].id for _ in range(150)]
    stop = threading.Event()
    taken: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def claimer() -> None:
        while not stop.is_set():
            for todo in queue.claim_next(agent=agent, queues=["race"], limit=2):
                with lock:
                    taken.append((todo.id, todo.claimed_at))
                time.sleep(0.02)
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id or "")

    def reaper() -> None:
        while not stop.is_set():
            queue.reap_once(batch=10)
            time.sleep(0.01)

    def stopper() -> None:
        time.sleep(1.0)
        stop.set()

    run_together([claimer] * 3 + [reaper, stopper])
    queue.reap_once(batch=1000)
    rows = {t.id: t for t in Todo.objects.filter(pk__in=ids)}
    claimed = {i for i, _ in taken}
    assert len(taken) == len(claimed), "no todo claimed twice"
    assert all(at < deadline for _, at in taken), "no claim after the deadline"
    for todo_id, row in rows.items():
        if todo_id in claimed:
            assert row.state == TodoState.DONE, row.state
        else:
            assert row.state == TodoState.CANCELLED and row.errors[-1]["reason"] == "expired"
    assert claimed and len(claimed) < len(ids), "both sides won some (else the race was not run)"


@pytest.mark.parametrize(
    "body,field",
    [
        ({"expires_at": "2100-01-01T00:00:00Z", "expire_after_seconds": 5}, "expires_at"),
        ({"expire_after_seconds": 0}, "expire_after_seconds"),
        ({"expire_after_seconds": -3}, "expire_after_seconds"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"expires_at": "2100-01-01T00:00:00"}, "expires_at"),
    ],
)
def test_bad_deadlines_are_400_naming_the_field(api: Any, body: dict[str, Any], field: str) -> None:
    response = api.post("/todos/", {"queue": "jobs", **body})
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not Todo.objects.exists()
