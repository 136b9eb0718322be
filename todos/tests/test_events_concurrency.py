"""MCP Events under concurrency (issue 33 item 2), threads with their own connections: the cursor's
watermark never skips a slow transaction's event, concurrent subscribes never pass the cap, and two notify
sidecars enqueue each event once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings

from todos import event_feed, queue
from todos.event_feed import Position
from todos.models import Agent, EventSubscription, Todo
from todos.notices import NOTIFY_QUEUE
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def claimed(agent: Agent, queue_name: str = "jobs") -> Todo:
    todo, _ = queue.create(queue=queue_name, title="t")
    return queue.claim(todo.id, agent=agent)


def test_a_slow_transactions_event_is_not_skipped_by_a_cursor_read_meanwhile(make_agent):
    agent = make_agent("alice")
    sub = event_feed.check(agent, "todo.finished", {})
    start = Position(event_feed.watermark())
    slow, fast = claimed(agent), claimed(agent)
    in_transaction, commit = threading.Event(), threading.Event()

    def slow_complete() -> None:
        try:
            with transaction.atomic():  # its row's updated_at is this transaction's start
                assert slow.lease_id is not None
                queue.complete(slow.id, agent=agent, lease_id=slow.lease_id)
                in_transaction.set()
                assert commit.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=slow_complete)
    thread.start()
    assert in_transaction.wait(30)
    assert fast.lease_id is not None
    queue.complete(fast.id, agent=agent, lease_id=fast.lease_id)  # committed, and later than the slow one
    meanwhile = event_feed.read(sub, start, 50)
    # A clock cursor would hand out the fast event and a cursor past the slow one: lost for good.
    assert meanwhile.events == []
    commit.set()
    thread.join(30)
    after = event_feed.read(sub, event_feed.decode_cursor(meanwhile.cursor) or start, 50)
    assert [e["data"]["todoId"] for e in after.events] == [slow.id, fast.id]


def test_concurrent_subscribes_never_pass_the_cap(make_agent):
    agent = make_agent("alice")
    sub = event_feed.check(agent, "todo.finished", {})

    def subscribe(n: int) -> str:
        try:
            event_feed.subscribe(
                sub,
                url=f"https://hooks.example/{n}",
                secret=SECRET,
                cursor=None,
                max_age_ms=None,
                ttl=timedelta(minutes=5),
            )
        except event_feed.ResourceExhausted:
            return "refused"
        return "subscribed"

    with override_settings(EVENTS_MAX_SUBSCRIPTIONS_PER_AGENT=3):
        results = run_together([lambda n=n: subscribe(n) for n in range(8)])
    assert sorted(results) == ["refused"] * 5 + ["subscribed"] * 3
    assert EventSubscription.objects.filter(agent=agent).count() == 3


def test_two_sidecars_enqueue_each_event_once(make_agent):
    agent = make_agent("alice")
    sub = event_feed.check(agent, "todo.finished", {})
    event_feed.subscribe(
        sub, url="https://hooks.example/a", secret=SECRET, cursor=None, max_age_ms=None, ttl=timedelta(minutes=5)
    )
    done = []
    for _ in range(5):
        todo = claimed(agent)
        assert todo.lease_id is not None
        done.append(queue.complete(todo.id, agent=agent, lease_id=todo.lease_id).id)
    for _ in range(3):  # rounds racing each other, then rounds with nothing new
        run_together([event_feed.enqueue_webhooks, event_feed.enqueue_webhooks])
    deliveries = Todo.objects.filter(queue=NOTIFY_QUEUE)
    assert sorted(d.payload["body"]["data"]["todoId"] for d in deliveries) == sorted(done)
