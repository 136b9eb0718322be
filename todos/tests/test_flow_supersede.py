"""Supersede and debounce by key (issue 31): a create with ``supersede`` replaces the runnable todo holding its
idempotency key (a claimed one's holder learns 409 superseded), racing claims included; ``debounce_seconds``
keeps one todo per key, run N seconds after the last create."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from todos import queue
from todos.errors import TodoSuperseded
from todos.models import Agent, Todo, TodoState
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def test_supersede_cancels_the_pending_holder_and_creates_the_new_one(api: Any) -> None:
    old = api.post("/todos/", {"queue": "reviews", "idempotency_key": "pr-7", "title": "commit a"}).json()
    response = api.post(
        "/todos/", {"queue": "reviews", "idempotency_key": "pr-7", "title": "commit b", "supersede": True}
    )
    assert response.status_code == 201, response.content
    new = response.json()
    assert new["id"] != old["id"] and new["state"] == "pending"
    gone = Todo.objects.get(pk=old["id"])
    assert gone.state == TodoState.CANCELLED and gone.errors[-1]["reason"] == "superseded"
    assert api.post("/todos/", {"queue": "reviews", "idempotency_key": "pr-7"}).json()["id"] == new["id"]


def test_a_superseded_holder_gets_409_superseded_on_its_next_step(api: Any) -> None:
    api.post("/todos/", {"queue": "reviews", "idempotency_key": "pr-8"})
    [held] = api.post("/todos/claim/", {"queues": ["reviews"]}).json()["todos"]
    api.post("/todos/", {"queue": "reviews", "idempotency_key": "pr-8", "supersede": True})
    for step in ("heartbeat", "complete", "fail"):
        response = api.post(f"/todos/{held['id']}/{step}/", {"lease_id": held["lease_id"]})
        assert response.status_code == 409, response.content
        assert response.json()["error"]["code"] == "superseded"


def test_supersede_racing_a_claim_leaves_one_runnable_todo_and_a_stopped_holder(agent: Agent) -> None:
    for round_ in range(12):
        key = f"race-{round_}"
        old, _ = queue.create(queue="race", idempotency_key=key)

        def claim() -> list[Todo]:
            return queue.claim_next(agent=agent, queues=["race"])

        def supersede(key: str = key) -> Todo:
            return queue.create(queue="race", idempotency_key=key, supersede=True)[0]

        claimed, new = run_together([claim, supersede])  # type: ignore[list-item]
        assert isinstance(new, Todo) and new.id != old.id
        assert Todo.objects.get(pk=old.id).state == TodoState.CANCELLED
        runnable = Todo.objects.filter(queue="race", idempotency_key=key).exclude(state=TodoState.CANCELLED)
        assert [t.id for t in runnable] == [new.id], "exactly one todo holds the key"
        for todo in claimed:  # type: ignore[union-attr]
            if todo.id == old.id:  # the claim won the row first: its holder is told to stop
                with pytest.raises(TodoSuperseded):
                    queue.complete(todo.id, agent=agent, lease_id=todo.lease_id or "")
            else:
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id or "")


def test_debounce_keeps_one_todo_per_key_run_after_the_last_create(api: Any) -> None:
    bodies = [
        {"queue": "builds", "idempotency_key": "main", "debounce_seconds": 60, "title": f"push {i}"} for i in range(3)
    ]
    answers = [api.post("/todos/", body) for body in bodies]
    assert [a.status_code for a in answers] == [201, 200, 200]
    assert len({a.json()["id"] for a in answers}) == 1
    todo = Todo.objects.get()
    assert todo.state == TodoState.SCHEDULED
    assert abs((todo.run_at - (timezone.now() + timedelta(seconds=60))).total_seconds()) < 5


def test_debounce_racing_creates_keeps_one_todo(agent: Agent) -> None:
    def create() -> Todo:
        return queue.create(queue="builds", idempotency_key="main", debounce_seconds=30)[0]

    made = run_together([create] * 8)
    assert len({t.id for t in made}) == 1
    assert Todo.objects.filter(queue="builds").count() == 1


@pytest.mark.parametrize(
    "body,field",
    [
        ({"supersede": True}, "supersede"),
        ({"debounce_seconds": 5}, "debounce_seconds"),
        ({"idempotency_key": "k", "debounce_seconds": -1}, "debounce_seconds"),
        ({"idempotency_key": "k", "supersede": "yes"}, "supersede"),
        ({"idempotency_key": "k", "supersede": True, "debounce_seconds": 5}, "debounce_seconds"),
        ({"idempotency_key": "k", "debounce_seconds": 5, "delay_seconds": 1}, "debounce_seconds"),
    ],
)
def test_bad_supersede_or_debounce_is_400_naming_the_field(api: Any, body: dict[str, Any], field: str) -> None:
    api.post("/todos/", {"queue": "jobs", "idempotency_key": "k"})
    response = api.post("/todos/", {"queue": "jobs", **body})
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert Todo.objects.get().state == TodoState.PENDING, "nothing superseded"


def test_a_batch_item_cannot_supersede(api: Any) -> None:
    response = api.post("/todos/batch/", {"todos": [{"queue": "jobs", "idempotency_key": "k", "supersede": True}]})
    assert response.status_code == 400


def test_a_claimed_holder_is_not_debounced(agent: Agent) -> None:
    queue.create(queue="builds", idempotency_key="main")
    [held] = queue.claim_next(agent=agent, queues=["builds"])
    todo, created = queue.create(queue="builds", idempotency_key="main", debounce_seconds=10)
    assert (todo.id, created) == (held.id, False)
    assert Todo.objects.get(pk=held.id).state == TodoState.CLAIMED
