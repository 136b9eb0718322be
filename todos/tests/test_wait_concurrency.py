"""Waits under races, against PostgreSQL with threads (each its own connection): two resolves of one
waitpoint over real HTTP, a timeout against a resolve, and children finishing while their parent starts
to wait for them."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from todos import queue
from todos.errors import WaitpointUsed
from todos.models import Dependency, Todo, TodoState, Waitpoint
from todos.tests.test_queue_notify import heard  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _race(*steps: Callable[[], Any]) -> list[Any]:
    """Run each step in its own thread, released together; each result or the exception it raised."""
    barrier = threading.Barrier(len(steps))
    results: list[Any] = [None] * len(steps)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = steps[i]()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(steps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _post(url: str, body: Any) -> int:
    request = urllib.request.Request(  # noqa: S310 (the test's own live server, http://)
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _token_wait(agent, make_todo) -> tuple[Todo, str]:
    todo = queue.claim(make_todo("jobs").id, agent=agent)
    waited, token = queue.wait(
        todo.id, agent=agent, lease_id=todo.lease_id, wait_for={"token": True}, timeout_seconds=60
    )
    assert token is not None
    return waited, token


def test_two_concurrent_resolves_of_one_waitpoint_answer_one_200_and_one_409(live_server, agent, make_todo):
    todo, token = _token_wait(agent, make_todo)
    url = f"{live_server.url}/api/v1/waitpoints/{token}/resolve/"
    statuses = _race(lambda: _post(url, {"data": {"n": 1}}), lambda: _post(url, {"data": {"n": 2}}))
    assert sorted(statuses) == [200, 409]
    after = Todo.objects.get(pk=todo.id)
    assert after.state == TodoState.PENDING
    assert [e["error"] for e in after.errors].count("wait resolved") == 1


@pytest.mark.parametrize("round_", range(5))
def test_a_timeout_racing_a_resolve_has_exactly_one_winner(agent, make_todo, round_):
    todo, token = _token_wait(agent, make_todo)
    Waitpoint.objects.filter(todo_id=todo.id).update(timeout_at=Now() - timedelta(seconds=1))
    timed_out, resolved = _race(
        lambda: queue.time_out_waits(batch=10), lambda: queue.resolve_token(token, data={"by": "ci"})
    )
    after = Todo.objects.get(pk=todo.id)
    assert after.state == TodoState.PENDING
    if isinstance(resolved, WaitpointUsed):
        assert timed_out == 1 and after.resolution["by"] == "timeout"
    else:
        # The timeout sweep either skipped the locked waitpoint or found it closed.
        assert timed_out == 0 and after.resolution["by"] == "token"
    entries = [e["error"] for e in after.errors]
    assert entries.count("wait resolved") + entries.count("wait timed out") == 1


def test_children_finishing_while_the_parent_starts_waiting_still_wake_it(make_agent, make_todo):
    agent = make_agent("fan")
    for _ in range(10):
        children = [queue.claim(make_todo("kids").id, agent=agent) for _ in range(8)]
        parent = queue.claim(make_todo("jobs").id, agent=agent)
        steps: list[Callable[[], Any]] = [
            (lambda c=c: queue.complete(c.id, agent=agent, lease_id=c.lease_id)) for c in children
        ]
        steps.append(
            lambda parent=parent, ids=[c.id for c in children]: queue.wait(
                parent.id, agent=agent, lease_id=parent.lease_id, wait_for={"todos": ids}, timeout_seconds=60
            )
        )
        results = _race(*steps)
        assert not [r for r in results if isinstance(r, Exception)]
        after = Todo.objects.get(pk=parent.id)
        assert after.state == TodoState.PENDING, after.dependencies_left
        assert [e["error"] for e in after.errors].count("wait resolved") == 1


def test_sixteen_threads_completing_the_children_of_a_waiting_parent_wake_it_exactly_once(make_agent, make_todo):
    agent = make_agent("fan")
    children = [queue.claim(make_todo("kids").id, agent=agent) for _ in range(16)]
    parent = queue.claim(make_todo("jobs").id, agent=agent)
    queue.wait(
        parent.id,
        agent=agent,
        lease_id=parent.lease_id,
        wait_for={"todos": [c.id for c in children]},
        timeout_seconds=60,
    )
    _race(*[(lambda c=c: queue.complete(c.id, agent=agent, lease_id=c.lease_id)) for c in children])
    after = Todo.objects.get(pk=parent.id)
    assert after.state == TodoState.PENDING
    assert [e["error"] for e in after.errors].count("wait resolved") == 1
    assert after.dependencies_left == 0 and not Dependency.objects.filter(dependent_id=parent.id).exists()


def test_a_resolved_wait_and_the_last_awaited_todo_notify_their_queues(agent, make_todo, heard):  # noqa: F811
    _, token = _token_wait(agent, make_todo)
    heard()
    queue.resolve_token(token, data={})
    assert heard() == ["jobs"]
    child = queue.claim(make_todo("kids").id, agent=agent)
    parent = queue.claim(make_todo("jobs").id, agent=agent)
    queue.wait(parent.id, agent=agent, lease_id=parent.lease_id, wait_for={"todos": [child.id]}, timeout_seconds=60)
    heard()
    queue.complete(child.id, agent=agent, lease_id=child.lease_id)
    assert heard() == ["jobs"]


@pytest.mark.parametrize("round_", range(5))
def test_a_timeout_racing_the_last_awaited_todo_has_exactly_one_winner(agent, make_todo, round_):
    child = queue.claim(make_todo("kids").id, agent=agent)
    parent = queue.claim(make_todo("jobs").id, agent=agent)
    queue.wait(parent.id, agent=agent, lease_id=parent.lease_id, wait_for={"todos": [child.id]}, timeout_seconds=60)
    Waitpoint.objects.filter(todo_id=parent.id).update(timeout_at=Now() - timedelta(seconds=1))
    timed_out, completed = _race(
        lambda: queue.time_out_waits(batch=10),
        lambda: queue.complete(child.id, agent=agent, lease_id=child.lease_id),
    )
    assert not isinstance(completed, Exception) and not isinstance(timed_out, Exception)
    after = Todo.objects.get(pk=parent.id)
    assert after.state == TodoState.PENDING
    assert after.resolution["by"] == ("timeout" if timed_out == 1 else "todos")
    entries = [e["error"] for e in after.errors]
    assert entries.count("wait resolved") + entries.count("wait timed out") == 1
    assert Waitpoint.objects.get(todo_id=parent.id).resolved_at is not None


def test_a_cancel_cascade_reaches_a_parent_that_starts_waiting_meanwhile(make_agent, make_todo):
    agent = make_agent("fan")
    for _ in range(10):
        # root dead-letters -> its dependents (made at create, policy cancel) are cancelled -> the parent,
        # waiting for those dependents, resolves: in the statement of the failure, or at once in its wait.
        root = queue.claim(make_todo("kids", max_attempts=1).id, agent=agent)
        dependents = [queue.create(queue="kids", depends_on=[root.id])[0] for _ in range(3)]
        parent = queue.claim(make_todo("jobs").id, agent=agent)
        results = _race(
            lambda root=root: queue.fail(root.id, agent=agent, lease_id=root.lease_id, error="boom"),
            lambda parent=parent, ids=[d.id for d in dependents]: queue.wait(
                parent.id, agent=agent, lease_id=parent.lease_id, wait_for={"todos": ids}, timeout_seconds=60
            ),
        )
        assert not [r for r in results if isinstance(r, Exception)]
        assert {t.state for t in Todo.objects.filter(pk__in=[d.id for d in dependents])} == {TodoState.CANCELLED}
        after = Todo.objects.get(pk=parent.id)
        assert after.state == TodoState.PENDING and after.resolution["by"] == "todos"
        assert [e["error"] for e in after.errors].count("wait resolved") == 1
