"""The transitions that make work claimable at once NOTIFY its queue from inside their own statement;
the others stay silent."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.db.models.functions import Now

from todos import queue, sql
from todos.longpoll import listener
from todos.models import Todo, TodoState

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard():
    params = listener._connection_params()
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")

        def drain() -> list[str]:
            return [n.payload for n in conn.notifies(timeout=0.3)]

        yield drain


def test_create_notifies_its_queue_once(heard, agent):
    queue.create(queue="q1", idempotency_key="k")
    queue.create(queue="q1", idempotency_key="k")  # a duplicate inserts nothing and says nothing
    assert heard() == ["q1"]


def test_claim_heartbeat_and_complete_are_silent(heard, agent):
    queue.create(queue="q1")
    heard()
    [todo] = queue.claim_next(agent=agent)
    queue.heartbeat(todo.id, agent=agent, lease_id=todo.lease_id)
    queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
    assert heard() == []


def test_release_notifies(heard, agent):
    queue.create(queue="q2")
    [todo] = queue.claim_next(agent=agent)
    heard()
    queue.release(todo.id, agent=agent, lease_id=todo.lease_id)
    assert heard() == ["q2"]


@pytest.mark.parametrize("retry_in, expected", [(0, ["q3"]), (60, [])])
def test_fail_notifies_only_when_the_retry_is_due_at_once(heard, agent, retry_in, expected):
    queue.create(queue="q3")
    [todo] = queue.claim_next(agent=agent)
    heard()
    queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, error="x", retry_in_seconds=retry_in)
    assert heard() == expected


def test_operator_retry_notifies(heard, agent):
    todo, _ = queue.create(queue="q4")
    Todo.objects.filter(pk=todo.pk).update(state=TodoState.FAILED, next_retry_at=None)
    heard()
    queue.retry_dead_letter(todo.id, mode="reset", operator="op")
    assert heard() == ["q4"]


def test_reaper_notifies_requeued_queues_once_each_with_their_count_but_not_dead_letters(heard, agent):
    for name in ("a", "a", "b"):
        todo, _ = queue.create(queue=name)
        Todo.objects.filter(pk=todo.pk).update(
            state=TodoState.CLAIMED,
            attempt=1,
            owner="w",
            lease_id="ls_a",
            lease_expires_at=Now() - timedelta(seconds=1),
        )
    dead, _ = queue.create(queue="c")
    Todo.objects.filter(pk=dead.pk).update(
        state=TodoState.CLAIMED,
        attempt=5,
        max_attempts=5,
        owner="w",
        lease_id="ls_c",
        lease_expires_at=Now() - timedelta(seconds=1),
    )
    heard()
    result = queue.requeue_lapsed(batch=10)
    assert (result.requeued, result.dead_lettered) == (3, 1)
    assert sorted(heard()) == ["a 2", "b"]  # two rows in a: two waiters may wake


def test_promoting_due_retries_notifies(heard, agent):
    todo, _ = queue.create(queue="q5")
    Todo.objects.filter(pk=todo.pk).update(state=TodoState.FAILED, next_retry_at=Now() - timedelta(seconds=1))
    heard()
    assert queue.promote_due_retries(batch=10) == 1
    assert heard() == ["q5"]


def test_notifies_wait_for_commit(heard, agent):
    from django.db import transaction

    with transaction.atomic():
        queue.create(queue="q6")
        assert heard() == []
    assert heard() == ["q6"]
    assert connection.in_atomic_block is False
