"""Waits on a claimed todo (issue 20), one call at a time against PostgreSQL: wait gives the lease back,
a waiting todo is never claimed, and each resolver (awaited todos, an event, a token, an agent, an
operator, the timeout) moves it to pending with its resolution. Races: test_wait_concurrency.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from todos import queue
from todos.errors import InvalidTransitionInput, TodoConflict, TodoNotFound, WaitpointUsed
from todos.models import Dependency, Todo, TodoState, Waitpoint

pytestmark = pytest.mark.django_db

DAY = 24 * 3600


def _claimed(agent, make_todo, queue_name="jobs", **kw):
    todo = make_todo(queue_name, **kw)
    return queue.claim(todo.id, agent=agent)


def _wait(agent, todo, wait_for, **kw):
    return queue.wait(todo.id, agent=agent, lease_id=todo.lease_id, wait_for=wait_for, timeout_seconds=DAY, **kw)


def _expire(todo):
    Waitpoint.objects.filter(todo_id=todo.id).update(timeout_at=Now() - timedelta(seconds=1))


def test_wait_gives_the_lease_and_the_attempt_back_and_shows_what_it_waits_for(agent, make_todo):
    todo = _claimed(agent, make_todo)
    waited, token = _wait(agent, todo, {"token": True})
    assert waited.state == TodoState.WAITING
    assert (waited.lease_id, waited.lease_expires_at, waited.attempt) == (None, None, 0)
    assert waited.waiting_for == {"token": True}
    assert token is not None and token not in str(waited.waiting_for) and len(token) >= 32
    assert Waitpoint.objects.get(todo_id=todo.id).token_hash != token
    assert waited.errors[-1]["error"] == "waiting"


def test_a_waiting_todo_is_never_claimed(agent, make_todo):
    todo = _claimed(agent, make_todo)
    _wait(agent, todo, {"token": True})
    assert queue.claim_next(agent=agent, limit=10) == []
    with pytest.raises(TodoConflict) as caught:
        queue.claim(todo.id, agent=agent)
    assert caught.value.state == TodoState.WAITING


def test_the_old_receipt_cannot_complete_a_waiting_todo(agent, make_todo):
    todo = _claimed(agent, make_todo)
    _wait(agent, todo, {"token": True})
    with pytest.raises(TodoConflict):
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)


def test_a_token_resolves_once_with_its_data_and_the_next_claim_reads_it(agent, make_todo):
    todo = _claimed(agent, make_todo)
    _, token = _wait(agent, todo, {"token": True})
    resolved = queue.resolve_token(token, data={"approved": True})
    assert resolved.state == TodoState.PENDING and resolved.waiting_for is None
    with pytest.raises(WaitpointUsed):
        queue.resolve_token(token, data={})
    again = queue.claim_next(agent=agent)[0]
    assert again.id == todo.id and again.attempt == 1
    assert again.resolution["by"] == "token" and again.resolution["data"] == {"approved": True}
    assert [e["error"] for e in again.errors] == ["waiting", "wait resolved"]


def test_an_unknown_token_is_not_found(db):
    with pytest.raises(TodoNotFound):
        queue.resolve_token("wpt_nothing", data={})


def test_waiting_for_todos_resolves_when_the_last_one_finishes(agent, make_todo):
    children = [make_todo("kids") for _ in range(3)]
    parent = _claimed(agent, make_todo)
    _wait(agent, parent, {"todos": [c.id for c in children]})
    first, second, third = (queue.claim(c.id, agent=agent) for c in children)
    queue.complete(first.id, agent=agent, lease_id=first.lease_id, result={"n": 1})
    queue.cancel(second.id, operator="ops")
    assert Todo.objects.get(pk=parent.id).state == TodoState.WAITING
    queue.fail(third.id, agent=agent, lease_id=third.lease_id, error="boom")  # a retry: not finished
    assert Todo.objects.get(pk=parent.id).state == TodoState.WAITING
    queue.cancel(third.id, operator="ops")
    after = Todo.objects.get(pk=parent.id)
    assert after.state == TodoState.PENDING
    assert after.resolution["by"] == "todos" and after.resolution["todos"] == [c.id for c in children]


def test_waiting_for_todos_already_finished_resolves_at_once(agent, make_todo):
    child = _claimed(agent, make_todo, "kids")
    queue.complete(child.id, agent=agent, lease_id=child.lease_id)
    parent = _claimed(agent, make_todo)
    waited, _ = _wait(agent, parent, {"todos": [child.id]})
    assert waited.state == TodoState.PENDING
    assert waited.resolution["by"] == "todos" and waited.resolution["todos"] == [child.id]


def test_a_dead_letter_finishes_an_awaited_todo(agent, make_todo):
    child = _claimed(agent, make_todo, "kids", max_attempts=1)
    parent = _claimed(agent, make_todo)
    _wait(agent, parent, {"todos": [child.id]})
    queue.fail(child.id, agent=agent, lease_id=child.lease_id, error="boom")
    assert Todo.objects.get(pk=parent.id).state == TodoState.PENDING


def test_a_wait_for_a_todo_outside_the_scopes_is_not_found_and_changes_nothing(make_agent, make_todo):
    agent = make_agent("narrow", claim=["jobs"])
    hidden = make_todo("secret")
    todo = _claimed(agent, make_todo)
    with pytest.raises(TodoNotFound, match=hidden.id):
        _wait(agent, todo, {"todos": [hidden.id]})
    assert Todo.objects.get(pk=todo.id).state == TodoState.CLAIMED
    assert not Waitpoint.objects.exists()


@pytest.mark.parametrize(
    ("wait_for", "timeout", "field"),
    [
        ({"token": True, "todos": ["td_x"]}, DAY, "for"),
        ({"sleep": 5}, DAY, "for.sleep"),
        ({"todos": [f"td_{i}" for i in range(101)]}, DAY, "for.todos"),
        ({"event": {"source": "gh", "type": "push", "match": {"a": {"b": 1}}}}, DAY, "for.event.match"),
        ({"event": {"source": "gh", "when": "now"}}, DAY, "for.event.when"),
        ({"token": True}, 31 * DAY, "timeout_seconds"),
        ({"token": True}, 0, "timeout_seconds"),
        ({"token": True}, None, "timeout_seconds"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(agent, make_todo, wait_for, timeout, field):
    todo = _claimed(agent, make_todo)
    with pytest.raises(InvalidTransitionInput) as caught:
        queue.wait(todo.id, agent=agent, lease_id=todo.lease_id, wait_for=wait_for, timeout_seconds=timeout)
    assert list(caught.value.extra["fields"]) == [field]
    assert Todo.objects.get(pk=todo.id).state == TodoState.CLAIMED
    assert not Waitpoint.objects.exists()


def test_an_agent_the_wait_names_resolves_it_in_its_scopes_only(make_agent, make_todo):
    worker = make_agent("worker", claim=["jobs"])
    outsider = make_agent("outsider", claim=["other"])
    reviewer = make_agent("reviewer", claim=["jobs"])
    todo = _claimed(worker, make_todo)
    _wait(worker, todo, {"token": True}, resolvers=["outsider", "reviewer"])
    with pytest.raises(TodoNotFound):
        queue.resolve(todo.id, by="outsider", agent=outsider, data={})
    resolved = queue.resolve(todo.id, by="reviewer", agent=reviewer, data={"ok": 1})
    assert resolved.resolution["by"] == "agent" and resolved.resolution["data"] == {"ok": 1}
    assert resolved.resolution["resolved_by"] == "reviewer"


def test_an_operator_rejects_with_a_note(agent, make_todo):
    todo = _claimed(agent, make_todo)
    _wait(agent, todo, {"token": True})
    resolved = queue.resolve(todo.id, by="staff:ops", verdict="rejected", note="not this week")
    assert resolved.resolution["verdict"] == "rejected" and resolved.resolution["note"] == "not this week"
    assert resolved.resolution["by"] == "operator"


def test_a_timeout_makes_it_pending_again_marked_timed_out(agent, make_todo):
    todo = _claimed(agent, make_todo)
    _wait(agent, todo, {"token": True})
    _expire(todo)
    assert queue.reap_once(batch=10).waits_timed_out == 1
    after = Todo.objects.get(pk=todo.id)
    assert after.state == TodoState.PENDING and after.resolution["timed_out"] is True
    assert after.errors[-1]["error"] == "wait timed out"


def test_a_timeout_with_fail_counts_toward_the_attempts(agent, make_todo):
    todo = _claimed(agent, make_todo, max_attempts=1)
    _wait(agent, todo, {"token": True}, on_timeout="fail")
    _expire(todo)
    queue.time_out_waits(batch=10)
    after = Todo.objects.get(pk=todo.id)
    assert after.state == TodoState.FAILED and after.is_dead_letter and after.attempt == 1


def test_a_cancelled_waiting_todo_cannot_be_resolved(agent, make_todo):
    todo = _claimed(agent, make_todo)
    _, token = _wait(agent, todo, {"token": True})
    queue.cancel(todo.id, operator="ops")
    with pytest.raises(WaitpointUsed) as caught:
        queue.resolve_token(token, data={})
    assert "state" not in caught.value.extra  # a token holder learns nothing more of the todo


def test_an_awaited_todo_that_finishes_twice_is_taken_off_once(agent, make_todo):
    a = _claimed(agent, make_todo, "kids", max_attempts=1)
    b = _claimed(agent, make_todo, "kids")
    parent = _claimed(agent, make_todo)
    _wait(agent, parent, {"todos": [a.id, b.id]})
    queue.fail(a.id, agent=agent, lease_id=a.lease_id, error="boom")  # a dead-letter: finished
    queue.retry_dead_letter(a.id, mode="once", operator="ops")
    again = queue.claim(a.id, agent=agent)
    queue.fail(a.id, agent=agent, lease_id=again.lease_id, error="boom")  # finished again
    assert Todo.objects.get(pk=parent.id).state == TodoState.WAITING  # b is still running
    queue.complete(b.id, agent=agent, lease_id=b.lease_id)
    assert Todo.objects.get(pk=parent.id).state == TodoState.PENDING


def test_a_new_wait_forgets_the_todos_an_earlier_one_awaited(agent, make_todo):
    child = _claimed(agent, make_todo, "kids")
    parent = _claimed(agent, make_todo)
    _wait(agent, parent, {"todos": [child.id]})
    queue.resolve(parent.id, by="staff:ops", data=None)
    parent = queue.claim(parent.id, agent=agent)
    _wait(agent, parent, {"token": True})
    queue.complete(child.id, agent=agent, lease_id=child.lease_id)
    assert Todo.objects.get(pk=parent.id).state == TodoState.WAITING  # still waiting for its token


def test_a_todo_cancelled_by_its_dependency_failing_finishes_it_for_a_wait(agent, make_todo):
    # The dependency's dead-letter cancels its dependent (on_dependency_failure cancel); the todo waiting
    # for that dependent must see it finish in the same statement, not at its timeout.
    dependency = _claimed(agent, make_todo, "kids", max_attempts=1)
    dependent, _ = queue.create(queue="kids", depends_on=[dependency.id])
    parent = _claimed(agent, make_todo)
    _wait(agent, parent, {"todos": [dependent.id]})
    queue.fail(dependency.id, agent=agent, lease_id=dependency.lease_id, error="boom")
    assert Todo.objects.get(pk=dependent.id).state == TodoState.CANCELLED
    after = Todo.objects.get(pk=parent.id)
    assert after.state == TodoState.PENDING
    assert after.resolution["by"] == "todos" and after.resolution["todos"] == [dependent.id]
    assert [e["error"] for e in after.errors].count("wait resolved") == 1
    assert Waitpoint.objects.get(todo_id=parent.id).resolved_at is not None  # the timeout sweep finds nothing
    assert queue.time_out_waits(batch=10) == 0


def test_a_wait_that_timed_out_leaves_no_edge_to_count_off_the_next_one(agent, make_todo):
    old, again = _claimed(agent, make_todo, "kids"), _claimed(agent, make_todo, "kids")
    parent = _claimed(agent, make_todo)
    _wait(agent, parent, {"todos": [old.id, again.id]})
    _expire(parent)
    assert queue.time_out_waits(batch=10) == 1
    parent = queue.claim(parent.id, agent=agent)
    _wait(agent, parent, {"todos": [again.id]})  # the same child again: its old edge is replaced
    queue.complete(old.id, agent=agent, lease_id=old.lease_id)  # awaited by the old wait only
    assert Todo.objects.get(pk=parent.id).state == TodoState.WAITING
    queue.complete(again.id, agent=agent, lease_id=again.lease_id)
    after = Todo.objects.get(pk=parent.id)
    assert after.state == TodoState.PENDING and after.resolution["todos"] == [again.id]
    assert not Dependency.objects.filter(dependent_id=parent.id).exists()


def test_a_wait_on_todos_ignores_the_waiters_on_dependency_failure(agent, make_todo):
    # A wait resolves whatever its todos' outcomes; on_dependency_failure is for dependencies made at create.
    child = _claimed(agent, make_todo, "kids", max_attempts=1)
    parent = _claimed(agent, make_todo)
    Todo.objects.filter(pk=parent.id).update(on_dependency_failure="cancel")
    _wait(agent, parent, {"todos": [child.id]})
    queue.fail(child.id, agent=agent, lease_id=child.lease_id, error="boom")
    after = Todo.objects.get(pk=parent.id)
    assert after.state == TodoState.PENDING and after.resolution["by"] == "todos"
