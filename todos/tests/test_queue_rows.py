"""queue.py builds the Todos it returns from its statements' rows itself (`make bench`:
RawQuerySet and Model.__init__ were most of its own cost). Those Todos must be ordinary model instances."""

from __future__ import annotations

import pytest
from django.db import IntegrityError
from django.db.models.signals import post_init

from switchboard import dberrors
from todos import queue, sql
from todos.errors import TodoConflict
from todos.models import Todo, TodoState
from todos.rows import fetch_todos_reviving


def _fields(todo: Todo) -> dict:
    return {f.attname: getattr(todo, f.attname) for f in Todo._meta.concrete_fields}


def test_claimed_todo_equals_the_row_the_orm_reads(agent, make_todo):
    make_todo("q", payload={"n": [1, 2]}, idempotency_key="k", errors=[{"error": "before"}])
    [todo] = queue.claim_next(agent=agent)
    assert _fields(todo) == _fields(Todo.objects.get(pk=todo.pk))
    assert todo.payload == {"n": [1, 2]} and todo.errors == [{"error": "before"}]
    assert todo.created_at.utcoffset().total_seconds() == 0


def test_returned_todo_saves_as_an_update_not_an_insert(agent, make_todo):
    make_todo("q")
    [todo] = queue.claim_next(agent=agent)
    assert todo._state.adding is False and todo._state.db == "default"
    todo.title = "renamed"
    todo.save(update_fields=["title"])
    assert Todo.objects.get(pk=todo.pk).title == "renamed"
    assert Todo.objects.count() == 1


def test_init_signal_listeners_still_see_returned_todos(agent, make_todo):
    make_todo("q")
    seen: list[str] = []

    def listener(sender, instance, **kwargs):
        seen.append(instance.id)

    post_init.connect(listener, sender=Todo)
    try:
        [todo] = queue.claim_next(agent=agent)
    finally:
        post_init.disconnect(listener, sender=Todo)
    assert seen == [todo.id]


def test_a_violated_shape_check_is_not_read_as_a_taken_idempotency_key(agent, make_todo):
    make_todo("q")
    [todo] = queue.claim_next(agent=agent)
    params = {"id": todo.id, "lease_id": todo.lease_id, "agent": agent.name, "visible": ["%"], "lease_seconds": None}
    params.update(progress=None, checkpoint=None)
    # A heartbeat without a lease length would leave a claim without its expiry: the claimed shape CHECK.
    with pytest.raises(IntegrityError) as caught:
        fetch_todos_reviving(sql.HEARTBEAT, params, "heartbeat", todo.id)
    assert dberrors.constraint_name(caught.value) == "todo_claimed_shape"


def test_a_taken_idempotency_key_is_a_conflict_naming_it(agent, make_todo):
    make_todo("q", state=TodoState.FAILED, attempt=5, idempotency_key="k")  # a dead-letter frees its key
    newer = make_todo("q", idempotency_key="k")
    dead = Todo.objects.exclude(pk=newer.pk).get()
    with pytest.raises(TodoConflict) as caught:
        queue.retry_dead_letter(dead.id, mode="reset", operator="op")
    assert caught.value.extra["reason"] == "idempotency_key_taken"
