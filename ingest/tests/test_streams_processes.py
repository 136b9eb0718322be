"""consume_stream as real processes against a real redis-server and the test database: kill -9 mid-batch,
two consumers in one group, a Redis restart mid-run, SIGTERM with a batch in hand, and the metrics port.

A consumer is held mid-batch without any hook in the product code: the test locks the events table
(SHARE mode: reads go on, inserts wait), so the consumer has read its batch from Redis and waits in its
INSERT, uncommitted, for as long as the test likes.
"""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from events.models import Event
from ingest.models import Route, Source
from ingest.tests.streams_support import Consumer, database_url, free_port, wait_for
from todos.models import Todo

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STREAM, GROUP = "orders", "switchboard"


@pytest.fixture
def stream_source(db: None) -> Source:
    source = Source.objects.create(slug="orders-stream", provider="stream")
    Route.objects.create(source=source, event_pattern="order.*", queue="orders", title_template="Order {id}")
    return source


@pytest.fixture
def consumers(redis_server: Any, tmp_path: Path) -> Iterator[Any]:
    started: list[Consumer] = []

    def start(name: str, *args: str, **env: str) -> Consumer:
        common = ["--redis-url", redis_server.url, "--stream", STREAM, "--group", GROUP, "--source", "orders-stream"]
        consumer = Consumer(tmp_path / f"{name}.log", [*common, "--consumer", name, "--block-ms", "100", *args], **env)
        started.append(consumer)
        wait_for(lambda: "stream consumer started" in consumer.output() or consumer.proc.poll() is not None, 60)
        assert consumer.proc.poll() is None, consumer.output()
        return consumer

    yield start
    for consumer in started:
        consumer.stop()


@pytest.fixture
def events_locked() -> Iterator[Any]:
    """A context in which inserts into events_event wait (another connection holds SHARE on it)."""
    conn = psycopg.connect(database_url())

    class Lock:
        def __enter__(self) -> None:
            conn.execute("LOCK TABLE events_event IN SHARE MODE")

        def __exit__(self, *exc: object) -> None:
            conn.rollback()

    yield Lock()
    conn.close()


def xadd_orders(client: redis.Redis, numbers: range) -> None:
    for n in numbers:
        client.xadd(STREAM, {"type": "order.created", "delivery_id": f"ord-{n}", "payload": json.dumps({"id": n})})


def pending_of(client: redis.Redis, consumer: str) -> int:
    try:
        infos = client.xinfo_consumers(STREAM, GROUP)
    except redis.ResponseError:  # NOGROUP: the consumer has started but not yet made its group
        return 0
    for info in infos:
        if info["name"].decode() == consumer:
            return int(info["pending"])
    return 0


def total_pending(client: redis.Redis) -> int:
    """The group's pending entries; -1 while the group does not exist yet (a consumer prints that it started
    before it makes its group, so a wait for "nothing pending" must not pass, or fail, before then)."""
    try:
        return int(client.xpending(STREAM, GROUP)["pending"])
    except redis.ResponseError as error:
        if "NOGROUP" not in str(error):
            raise
        return -1


def group_lag(client: redis.Redis) -> int:
    """The group's lag; -1 while the group does not exist yet (as total_pending)."""
    groups = client.xinfo_groups(STREAM)
    return int(groups[0]["lag"]) if groups else -1


def batch_counts(output: str, name: str) -> int:
    return sum(int(n) for n in re.findall(rf"\b{name}=(\d+)", output))


def assert_each_order_once(count: int) -> None:
    assert Event.objects.count() == count
    assert sorted(Event.objects.values_list("delivery_id", flat=True)) == sorted(f"ord-{n}" for n in range(count))
    assert Todo.objects.count() == count  # one route: one todo per event, none twice


def test_after_kill_9_mid_batch_a_second_consumer_takes_the_entries_over(
    redis_client, stream_source, consumers, events_locked
):
    xadd_orders(redis_client, range(20))
    with events_locked:
        first = consumers("first", "--batch", "20")
        wait_for(lambda: pending_of(redis_client, "first") == 20, what="the first consumer to read its batch")
        first.kill()  # its transaction never commits; its 20 entries stay pending under its name
    assert Event.objects.count() == 0 and total_pending(redis_client) == 20

    second = consumers("second", "--batch", "20", "--claim-idle-ms", "300")
    wait_for(lambda: total_pending(redis_client) == 0, what="the second consumer to claim and ack the entries")
    assert_each_order_once(20)
    assert "read=20 stored=20 duplicate=0" in second.output()


def test_after_kill_9_between_commit_and_ack_the_takeover_stores_nothing_twice(
    redis_client, stream_source, consumers, events_locked
):
    xadd_orders(redis_client, range(20))
    with events_locked:
        first = consumers("first", "--batch", "20")
        wait_for(lambda: pending_of(redis_client, "first") == 20, what="the first consumer to read its batch")
        # Writes (XACK among them) now wait in Redis; the commit is free to happen.
        redis_client.execute_command("CLIENT", "PAUSE", "20000", "WRITE")
    try:
        wait_for(lambda: Event.objects.count() == 20, what="the first consumer's commit")
        first.kill()  # committed, never acked
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    assert total_pending(redis_client) == 20

    second = consumers("second", "--batch", "20", "--claim-idle-ms", "300")
    wait_for(lambda: total_pending(redis_client) == 0, what="the second consumer to claim and ack the entries")
    assert_each_order_once(20)
    assert "read=20 stored=0 duplicate=20" in second.output()


def test_two_consumers_in_one_group_share_the_stream_and_store_each_entry_once(redis_client, stream_source, consumers):
    one = consumers("one", "--batch", "5")
    two = consumers("two", "--batch", "5")
    for start in range(0, 200, 5):  # in small bursts, so both are waiting when entries arrive
        xadd_orders(redis_client, range(start, start + 5))
        wait_for(lambda: group_lag(redis_client) == 0, what="the burst to be read")
    wait_for(lambda: Event.objects.count() == 200 and total_pending(redis_client) == 0, what="all 200 stored")
    assert_each_order_once(200)
    stored = [batch_counts(c.output(), "stored") for c in (one, two)]
    assert sum(stored) == 200 and all(stored), stored  # each took a share; none stored an entry twice
    assert batch_counts(one.output(), "duplicate") + batch_counts(two.output(), "duplicate") == 0


def test_a_redis_restart_mid_run_is_survived_and_nothing_is_lost(redis_server, redis_client, stream_source, consumers):
    consumer = consumers("only", "--batch", "10")
    xadd_orders(redis_client, range(50))
    wait_for(lambda: Event.objects.count() == 50, what="the first 50")

    redis_server.restart(down_seconds=1.0)  # the consumer's reads fail meanwhile: it backs off and retries
    client = redis_server.client()
    xadd_orders(client, range(50, 100))
    wait_for(lambda: Event.objects.count() == 100 and total_pending(client) == 0, 60, "the next 50 after the restart")
    assert_each_order_once(100)
    output = consumer.output()
    assert "stream consumer pass failed" in output and "cause=redis" in output
    assert "stream consumer recovered" in output
    assert consumer.proc.poll() is None
    client.close()


def test_sigterm_with_a_batch_in_hand_stores_and_acks_it_then_exits(
    redis_client, stream_source, consumers, events_locked
):
    xadd_orders(redis_client, range(10))
    with events_locked:
        consumer = consumers("only", "--batch", "10")
        wait_for(lambda: pending_of(redis_client, "only") == 10, what="the consumer to read its batch")
        consumer.proc.send_signal(signal.SIGTERM)
    assert consumer.proc.wait(30) == 0
    assert_each_order_once(10)
    assert total_pending(redis_client) == 0
    assert "stream consumer stopped" in consumer.output()


def test_the_metrics_port_serves_entry_counts_pending_and_lag(redis_client, stream_source, consumers):
    port = free_port()
    consumers("only", "--metrics-port", str(port))
    xadd_orders(redis_client, range(3))
    redis_client.xadd(STREAM, {"payload": "{}"})  # no type: rejected
    wait_for(lambda: total_pending(redis_client) == 0 and Event.objects.count() == 3, what="the entries")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    def samples() -> dict[str, float]:
        found = {}
        for line in scrape().splitlines():
            if line.startswith("switchboard_stream_") and 'stream="orders"' in line:
                name, value = line.rsplit(" ", 1)
                found[name] = float(value)
        return found

    wait_for(lambda: samples().get('switchboard_stream_entries_total{outcome="stored",stream="orders"}') == 3)
    found = samples()
    assert found['switchboard_stream_entries_read_total{stream="orders",via="new"}'] == 4
    assert found['switchboard_stream_entries_total{outcome="rejected",stream="orders"}'] == 1
    assert found['switchboard_stream_pending{group="switchboard",stream="orders"}'] == 0
    assert found['switchboard_stream_lag{group="switchboard",stream="orders"}'] == 0
    assert found['switchboard_stream_redis_up{group="switchboard",stream="orders"}'] == 1
