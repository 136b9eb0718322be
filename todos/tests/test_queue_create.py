from __future__ import annotations

import pytest

from todos import queue
from todos.errors import InvalidTransitionInput
from todos.models import Queue, Todo, TodoState


def test_create_makes_a_pending_todo_with_a_td_id(db):
    todo, created = queue.create(queue="github.prs", kind="review", title="Review #1", payload={"n": 1})
    assert created is True
    assert todo.id.startswith("td_") and len(todo.id) == 35
    todo.refresh_from_db()
    assert (todo.state, todo.attempt, todo.max_attempts, todo.errors) == (TodoState.PENDING, 0, 5, [])
    assert todo.payload == {"n": 1}
    assert todo.created_at is not None
    assert Queue.objects.filter(name="github.prs").exists()


def test_create_with_a_runnable_key_returns_the_existing_todo(db):
    first, created = queue.create(queue="q", idempotency_key="k1")
    second, created_again = queue.create(queue="q", idempotency_key="k1", title="other")
    assert created and not created_again
    assert second.id == first.id
    assert Todo.objects.count() == 1


def test_create_with_the_same_key_in_another_queue_is_a_new_todo(db):
    queue.create(queue="a", idempotency_key="k")
    queue.create(queue="b", idempotency_key="k")
    assert Todo.objects.count() == 2


@pytest.mark.parametrize(
    ("state", "next_retry", "frees_key"),
    [
        (TodoState.CLAIMED, False, False),
        (TodoState.DONE, False, True),
        (TodoState.FAILED, True, False),  # waiting for a retry still holds its key (SPEC decision 3)
        (TodoState.FAILED, False, True),  # a dead-letter frees it
    ],
)
def test_create_dedup_covers_every_todo_that_can_still_run(make_todo, state, next_retry, frees_key):
    from django.db.models.functions import Now

    original = make_todo("q", idempotency_key="k", state=state, next_retry_at=Now() if next_retry else None)
    todo, created = queue.create(queue="q", idempotency_key="k")
    assert created is frees_key
    assert (todo.id == original.id) is (not frees_key)


def test_create_outside_the_agents_create_scopes_is_invalid_and_stores_nothing(make_agent):
    agent = make_agent("bot", claim=["github.*"], create=["github.*"])
    with pytest.raises(InvalidTransitionInput):
        queue.create(queue="stripe.events", agent=agent)
    assert Todo.objects.count() == 0
    todo, _ = queue.create(queue="github.push", agent=agent)
    assert todo.queue == "github.push"


def test_create_rejects_a_malformed_queue_name(db):
    with pytest.raises(InvalidTransitionInput) as caught:
        queue.create(queue="has space")
    assert list(caught.value.extra["fields"]) == ["queue"] and "Queue names are" in caught.value.detail
    assert Todo.objects.count() == 0


@pytest.mark.parametrize("name", [7, None, ["q"]])
def test_create_rejects_a_queue_name_that_is_not_a_string_naming_the_field(db, name):
    # A caller other than the serializers (MCP, a route, a script) may pass anything.
    with pytest.raises(InvalidTransitionInput) as caught:
        queue.create(queue=name)
    assert list(caught.value.extra["fields"]) == ["queue"]
    assert Todo.objects.count() == 0
