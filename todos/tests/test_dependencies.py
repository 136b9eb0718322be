"""Dependencies at create (issue 20): a todo that names unfinished todos waits, and the statement that
finishes the last of them moves it on, in the same transaction; a dependency that dead-letters or is
cancelled applies the dependent's on_dependency_failure. Real PostgreSQL; the races with real threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection

from todos import queue
from todos.errors import InvalidTransitionInput, TodoNotFound
from todos.models import Agent, Dependency, Todo, TodoState
from todos.sql import NOTIFY_CHANNEL
from todos.tests.test_concurrency import run_together


def _claimed(agent: Agent, todo_id: str) -> Todo:
    return queue.claim(todo_id, agent=agent, lease_seconds=300)


def _done(agent: Agent, todo_id: str, result: Any = None) -> Todo:
    held = _claimed(agent, todo_id)
    assert held.lease_id is not None
    return queue.complete(todo_id, agent=agent, lease_id=held.lease_id, result=result)


def _fresh(todo: Todo | queue.TodoRef) -> Todo:
    return Todo.objects.get(pk=todo.id)


@pytest.mark.django_db
class TestWaiting:
    def test_a_todo_with_an_unfinished_dependency_waits_and_is_never_claimed(self, agent):
        child, _ = queue.create(queue="kids")
        parent, created = queue.create(queue="parents", depends_on=[child.id])
        assert created and parent.state == TodoState.WAITING and parent.dependencies_left == 1
        assert parent.waiting_for == {"todos": [child.id]}
        assert queue.claim_next(agent=agent, queues=["parents"]) == []

    def test_the_last_dependency_done_makes_it_pending_in_the_same_statement(self, agent):
        a, _ = queue.create(queue="kids")
        b, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id, b.id])
        _done(agent, a.id)
        assert _fresh(parent).state == TodoState.WAITING and _fresh(parent).dependencies_left == 1
        _done(agent, b.id, {"n": 2})
        after = _fresh(parent)
        assert after.state == TodoState.PENDING and after.dependencies_left == 0 and after.waiting_for is None
        assert after.resolution and after.resolution["by"] == "dependencies"
        assert [t.id for t in queue.claim_next(agent=agent, queues=["parents"])] == [parent.id]

    def test_a_dependent_whose_run_at_is_ahead_becomes_scheduled(self, agent):
        a, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id], delay_seconds=3600)
        _done(agent, a.id)
        assert _fresh(parent).state == TodoState.SCHEDULED

    def test_dependencies_already_done_make_it_pending_at_once(self, agent):
        a, _ = queue.create(queue="kids")
        _done(agent, a.id)
        parent, _ = queue.create(queue="parents", depends_on=[a.id])
        assert parent.state == TodoState.PENDING and parent.dependencies_left == 0

    def test_completing_two_children_in_one_batch_counts_both_off(self, agent):
        a, _ = queue.create(queue="kids")
        b, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id, b.id])
        held = [_claimed(agent, a.id), _claimed(agent, b.id)]
        queue.complete_many([(t.id, t.lease_id, None) for t in held], agent=agent)  # type: ignore[misc]
        assert _fresh(parent).state == TodoState.PENDING

    def test_the_same_id_twice_is_one_dependency(self):
        a, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id, a.id])
        assert parent.depends_on == [a.id] and parent.dependencies_left == 1


@pytest.mark.django_db
class TestOnDependencyFailure:
    def test_cancel_by_default_cancels_the_dependent_and_names_the_dependency(self, agent):
        a, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id])
        queue.cancel(a.id, operator="ops", reason="not needed")
        after = _fresh(parent)
        assert after.state == TodoState.CANCELLED and after.completed_at is not None
        assert after.errors[-1]["dependency"] == a.id and after.errors[-1]["error"] == "dependency cancelled"

    def test_a_dead_lettered_dependency_cancels_a_dependent_whose_policy_is_cancel(self, agent):
        a, _ = queue.create(queue="kids", max_attempts=1)
        parent, _ = queue.create(queue="parents", depends_on=[a.id], on_dependency_failure="cancel")
        held = _claimed(agent, a.id)
        queue.fail(a.id, agent=agent, lease_id=held.lease_id or "", error="boom")
        after = _fresh(parent)
        assert after.state == TodoState.CANCELLED
        assert after.errors[-1] | {"dependency": a.id, "error": "dependency dead-letter"} == after.errors[-1]

    def test_run_makes_the_dependent_pending_anyway(self, agent):
        a, _ = queue.create(queue="kids", max_attempts=1)
        b, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id, b.id], on_dependency_failure="run")
        held = _claimed(agent, a.id)
        queue.fail(a.id, agent=agent, lease_id=held.lease_id or "", error="boom")
        assert _fresh(parent).state == TodoState.WAITING and _fresh(parent).dependencies_left == 1
        _done(agent, b.id)
        assert _fresh(parent).state == TodoState.PENDING

    def test_a_retry_waiting_dependency_is_not_finished(self, agent):
        a, _ = queue.create(queue="kids", max_attempts=3)
        parent, _ = queue.create(queue="parents", depends_on=[a.id])
        held = _claimed(agent, a.id)
        queue.fail(a.id, agent=agent, lease_id=held.lease_id or "", error="flaky")
        assert _fresh(parent).state == TodoState.WAITING

    def test_a_cancel_cascades_down_a_chain_of_dependents(self):
        a, _ = queue.create(queue="kids")
        b, _ = queue.create(queue="mid", depends_on=[a.id])
        c, _ = queue.create(queue="top", depends_on=[b.id])
        r, _ = queue.create(queue="top", depends_on=[b.id], on_dependency_failure="run")
        queue.cancel(a.id, operator="ops")
        assert _fresh(b).state == _fresh(c).state == TodoState.CANCELLED
        assert _fresh(c).errors[-1]["dependency"] == b.id
        assert _fresh(r).state == TodoState.PENDING

    def test_cancelling_a_dependency_and_its_dependent_together_cancels_each_once(self):
        a, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id])
        cancelled = queue.cancel_many([a.id, parent.id], operator="ops")
        assert {t.id for t in cancelled} == {a.id, parent.id}
        assert [e["error"] for e in _fresh(parent).errors] == ["cancelled"]

    def test_a_dependency_already_cancelled_creates_the_dependent_cancelled(self):
        a, _ = queue.create(queue="kids")
        queue.cancel(a.id, operator="ops")
        parent, created = queue.create(queue="parents", depends_on=[a.id])
        assert created and parent.state == TodoState.CANCELLED and parent.errors[-1]["dependency"] == a.id

    def test_a_dead_letter_completed_later_by_its_slow_worker_settles_nothing_twice(self, agent):
        a, _ = queue.create(queue="kids", max_attempts=1)
        b, _ = queue.create(queue="kids")
        parent, _ = queue.create(queue="parents", depends_on=[a.id, b.id], on_dependency_failure="run")
        held = _claimed(agent, a.id)
        # The lease lapses at the cap: the reaper dead-letters it, which counts it off (run).
        with connection.cursor() as cursor:
            cursor.execute("UPDATE todos_todo SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [a.id])
        queue.reap_once(batch=10)
        assert _fresh(a).state == TodoState.FAILED and _fresh(parent).dependencies_left == 1
        queue.complete(a.id, agent=agent, lease_id=held.lease_id or "")  # the slow worker still holds the receipt
        assert _fresh(a).state == TodoState.DONE
        assert _fresh(parent).state == TodoState.WAITING and _fresh(parent).dependencies_left == 1


@pytest.mark.django_db
class TestRefused:
    def test_a_dependency_outside_the_creators_scopes_is_not_found_and_nothing_is_written(self, make_agent):
        hidden, _ = queue.create(queue="secret.q")
        creator = make_agent("narrow", claim=["open.*"], create=["open.*"])
        with pytest.raises(TodoNotFound) as caught:
            queue.create(queue="open.q", agent=creator, depends_on=[hidden.id])
        assert hidden.id in caught.value.detail and caught.value.extra["fields"] == {
            "depends_on": [f"No todo {hidden.id}."]
        }
        assert not Todo.objects.filter(queue="open.q").exists() and not Dependency.objects.exists()
        assert not _fresh(hidden).has_dependents

    def test_depends_on_index_must_name_an_earlier_item(self):
        with pytest.raises(InvalidTransitionInput) as caught:
            queue.create_many([{"queue": "q"}, {"queue": "q", "depends_on_index": [1]}])
        assert "todos.1.depends_on_index" in caught.value.extra["fields"]
        assert not Todo.objects.exists()


@pytest.mark.django_db
class TestBatch:
    def test_items_depend_on_earlier_items_by_index(self, agent):
        outcomes = queue.create_many(
            [
                {"queue": "kids", "idempotency_key": "a"},
                {"queue": "kids"},
                {"queue": "parents", "depends_on_index": [0, 1]},
            ]
        )
        (a, _), (b, _), (parent, made) = outcomes
        assert made and parent.state == TodoState.WAITING
        assert _fresh(parent).waiting_for == {"todos": [a.id, b.id]}
        assert _fresh(a).has_dependents and _fresh(b).has_dependents
        _done(agent, a.id)
        _done(agent, b.id)
        assert _fresh(parent).state == TodoState.PENDING

    def test_an_item_that_exists_already_is_depended_on_as_the_existing_todo(self, agent):
        existing, _ = queue.create(queue="kids", idempotency_key="a")
        (held, made), (parent, _) = queue.create_many(
            [{"queue": "kids", "idempotency_key": "a"}, {"queue": "parents", "depends_on_index": [0]}]
        )
        assert not made and held.id == existing.id
        assert _fresh(parent).waiting_for == {"todos": [existing.id]} == {"todos": _fresh(parent).depends_on}
        _done(agent, existing.id)
        assert _fresh(parent).state == TodoState.PENDING

    def test_two_items_with_one_key_are_one_todo(self):
        (first, made1), (second, made2) = queue.create_many(
            [{"queue": "q", "idempotency_key": "k"}, {"queue": "q", "idempotency_key": "k"}]
        )
        assert (made1, made2) == (True, False) and first.id == second.id and Todo.objects.count() == 1


# --- races: real threads, each with its own connection, committing for real -------------------------


def _listen(channel: str) -> Callable[[float], list[str]]:
    """A separate connection LISTENing on ``channel``; the callable drains the payloads that arrive."""
    settings = connection.get_connection_params()
    conn = psycopg.connect(**{k: v for k, v in settings.items() if k != "cursor_factory"}, autocommit=True)
    conn.execute(f"LISTEN {channel}")

    def drain(seconds: float) -> list[str]:
        got: list[str] = []
        for note in conn.notifies(timeout=seconds, stop_after=None):
            got.append(note.payload)
        return got

    drain.close = conn.close  # type: ignore[attr-defined]
    return drain


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_completing_the_children_make_the_parent_pending_exactly_once(make_agent):
    agent = make_agent("fan")
    children = [queue.create(queue="fan.kids")[0] for _ in range(16)]
    parent, _ = queue.create(queue="fan.parent", depends_on=[c.id for c in children])
    held = [_claimed(agent, c.id) for c in children]
    notes = _listen(NOTIFY_CHANNEL)
    try:
        run_together([lambda t=t: queue.complete(t.id, agent=agent, lease_id=t.lease_id or "") for t in held])
        payloads = notes(1.0)
    finally:
        notes.close()  # type: ignore[attr-defined]
    after = _fresh(parent)
    assert after.state == TodoState.PENDING and after.dependencies_left == 0
    assert payloads.count("fan.parent") == 1  # one wake: it became pending once
    assert not Dependency.objects.filter(dependent_id=parent.id).exists()  # every wait settled


@pytest.mark.django_db(transaction=True)
def test_a_create_racing_the_completion_of_its_dependency_never_waits_forever(make_agent):
    agent = make_agent("racer")
    for _ in range(12):
        child, _ = queue.create(queue="race.kids")
        held = _claimed(agent, child.id)
        made: list[Todo] = []

        def complete(child: Todo = child, held: Todo = held) -> Todo:
            return queue.complete(child.id, agent=agent, lease_id=held.lease_id or "")

        def create(child: Todo = child, made: list[Todo] = made) -> None:
            made.append(queue.create(queue="race.parent", depends_on=[child.id])[0])

        run_together([complete, create])
        assert _fresh(made[0]).state == TodoState.PENDING, "the dependent missed its dependency's completion"
