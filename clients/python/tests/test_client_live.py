"""The client against the shipped server: a todo's whole life through Client and AsyncClient, every verb,
errors raised as the API's codes, typed answers."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from switchboard_client import (
    AsyncClient,
    Client,
    Conflict,
    CreatedTodo,
    CreateOutcome,
    Forbidden,
    Invalid,
    NotFound,
    QueueStats,
    ServerUnreachable,
    Todo,
    Unauthorized,
    WaitingTodo,
)

from events.models import Event
from ingest.models import Route, Source
from todos import queue
from todos.models import Todo as TodoRow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def client(server, agent):
    with Client(server.base, agent.token) as client:
        yield client


def test_a_todo_lives_its_whole_life_through_the_sync_client(client):
    run_at = datetime.now(UTC) + timedelta(hours=1)
    created = client.create(
        "life",
        kind="review",
        title="Review #1",
        payload={"pr": 1},
        source="test",
        idempotency_key="pr-1",
        assignee="alice",
        max_attempts=3,
        priority=-5,
        run_at=run_at,
    )
    assert isinstance(created, CreatedTodo) and created.created and created.state == "scheduled"
    assert created.run_at == run_at.replace(microsecond=created.run_at.microsecond)
    again = client.create("life", idempotency_key="pr-1")
    assert again.id == created.id and not again.created

    soon = client.create("life", kind="review", payload={"pr": 2}, delay_seconds=0)
    assert client.get(soon.id).payload == {"pr": 2}
    assert [t.id for t in client.iter_todos(queue="life", page_size=1)] == [soon.id, created.id]
    page = client.list_todos(queue="life", state="pending")
    assert [t.id for t in page.items] == [soon.id] and page.next_cursor is None

    [claimed] = client.claim(["life"], limit=5, lease_seconds=30, worker="w1")
    assert isinstance(claimed, Todo) and claimed.id == soon.id and claimed.lease_id
    assert claimed.owner == "alice/w1" and claimed.lease_expires_at > datetime.now(UTC)
    beat = client.heartbeat(claimed, lease_seconds=60)
    assert beat.lease_expires_at > claimed.lease_expires_at
    released = client.release(claimed)
    assert released.state == "pending" and released.attempt == 0

    again = client.claim_one(soon.id, lease_seconds=30)
    failed = client.fail(again, error="flaky", retry_in_seconds=0)
    assert failed.state == "failed" and failed.errors[-1]["error"] == "flaky"
    [again] = client.claim(["life"], wait_seconds=5)
    done = client.complete(again, result={"ok": True})
    assert done.state == "done" and done.result == {"ok": True} and done.finished

    with pytest.raises(Conflict) as conflict:
        client.complete(again, result=None)
    assert conflict.value.state == "done" and conflict.value.status == 409

    cancelled = client.cancel(created.id, reason="not needed")
    assert cancelled.state == "cancelled"
    with pytest.raises(Conflict) as conflict:
        client.cancel(created.id)
    assert conflict.value.state == "cancelled"


def test_batch_complete_answers_one_outcome_per_item(client):
    for i in range(3):
        client.create("batch", payload={"n": i})
    todos = client.claim(["batch"], limit=3)
    outcomes = client.complete_many([(t, None, {"n": t.payload["n"]}) for t in todos] + [(todos[0], None, None)])
    assert [o.status for o in outcomes] == [200, 200, 200, 409]
    assert outcomes[0].todo is not None and outcomes[0].todo.state == "done"
    assert outcomes[3].error is not None and outcomes[3].error.state == "done"


def test_retry_revives_a_dead_letter(server, make_agent):
    operator = make_agent("ops", can_retry_dead_letters=True)
    with Client(server.base, operator.token) as client:
        client.create("dl", max_attempts=1)
        [todo] = client.claim(["dl"])
        dead = client.fail(todo, error="boom")
        assert dead.dead_letter and dead.state == "failed"
        revived = client.retry(dead.id, mode="once", note="fixed")
        assert revived.state == "pending" and not revived.dead_letter


def test_queues_are_listed_paused_resumed_and_limited(server, make_agent):
    manager = make_agent("manager", can_manage_queues=True)
    with Client(server.base, manager.token) as client:
        client.create("ops.q")
        [stats] = [q for q in client.queues() if q.queue == "ops.q"]
        assert isinstance(stats, QueueStats) and stats.pending == 1 and not stats.paused
        assert client.pause("ops.q").paused and client.claim(["ops.q"]) == []
        assert not client.resume("ops.q").paused
        limited = client.set_limits("ops.q", max_claimed=2, rate_per_second=5.0)
        assert (limited.max_claimed, limited.rate_per_second) == (2, 5.0)
        cleared = client.set_limits("ops.q", max_claimed=None)
        assert cleared.max_claimed is None and cleared.rate_per_second == 5.0
        assert client.queue("ops.q").rate_per_second == 5.0
        fair = client.set_limits("ops.q", fair=True, fair_weights={"big": 3}, max_claimed_per_key=1)
        assert fair.fair and fair.fair_weights == {"big": 3.0} and fair.max_claimed_per_key == 1
        assert fair.rate_per_second == 5.0  # the settings not given stay
        for key in ("big", "big", "small"):
            client.create("ops.q", fair_key=key)
        assert [t.fair_key for t in client.list_todos(fair_key="big").items] == ["big", "big"]
        claimed = client.claim(["ops.q"], limit=10)  # one lease per key at most
        assert sorted(t.fair_key for t in claimed) == ["", "big", "small"]
        assert client.schedules() == []


def test_events_are_listed_read_and_replayed(client, agent):
    source = Source.objects.create(slug="gh", provider="github", secret="s")
    Route.objects.create(source=source, event_pattern="*", queue="ev")
    event = Event.objects.create(source="gh", type="push", delivery_id="d1", payload={"a": 1})
    assert [e.id for e in client.iter_events(source="gh")] == [event.id]
    read = client.event(event.id)
    assert read.payload == {"a": 1} and read.type == "push"
    replay = client.replay(event.id)
    assert replay.event_id == event.id and len(replay.created_todo_ids) == 1
    assert TodoRow.objects.get(pk=replay.created_todo_ids[0]).queue == "ev"


def test_errors_are_raised_as_the_apis_codes(server, client, make_agent):
    with pytest.raises(NotFound):
        client.get("td_nope")
    with pytest.raises(Invalid) as invalid:
        client.create("q", priority=1000)
    assert "priority" in invalid.value.fields
    narrow = make_agent("narrow", claim=["mine"])
    with Client(server.base, narrow.token) as other, pytest.raises(Forbidden) as forbidden:
        other.claim(["theirs"])
    assert forbidden.value.queues == ["theirs"]
    with Client(server.base, "sb_wrong") as wrong, pytest.raises(Unauthorized):
        wrong.queues()
    with Client("http://127.0.0.1:9", "x", retries=1, backoff=0.01) as down, pytest.raises(ServerUnreachable) as e:
        down.queues()
    assert "127.0.0.1:9" in str(e.value)


def test_client_reads_the_url_and_token_from_the_environment(server, agent, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_URL", server.base)
    monkeypatch.setenv("SWITCHBOARD_TOKEN", agent.token)
    with Client() as client:
        assert client.create("envq").queue == "envq"


def test_a_todo_lives_its_whole_life_through_the_async_client(server, agent):
    async def life() -> None:
        async with AsyncClient(server.base, agent.token) as client:
            created = await client.create("alife", kind="k", payload={"x": 1}, idempotency_key="a1")
            assert created.created
            assert (await client.get(created)).payload == {"x": 1}
            assert [t.id async for t in client.iter_todos(queue="alife")] == [created.id]
            [claimed] = await client.claim(["alife"], wait_seconds=2, lease_seconds=10)
            await client.heartbeat(claimed)
            failed = await client.fail(claimed, error="again", retry_in_seconds=0)
            assert failed.state == "failed"
            [claimed] = await client.claim(["alife"], wait_seconds=5)
            [outcome] = await client.complete_many([(claimed, None, {"done": 1})])
            assert outcome.ok and outcome.todo is not None and outcome.todo.result == {"done": 1}
            assert [q.queue for q in await client.queues() if q.queue == "alife"] == ["alife"]
            with pytest.raises(Conflict):
                await client.release(claimed)
            with pytest.raises(NotFound):
                await client.event("ev_nope")
            # A long-poll that finds nothing answers an empty list when its time is up.
            assert await client.claim(["alife.none"], wait_seconds=0.5) == []

    asyncio.run(life())


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_progress_and_a_checkpoint_ride_the_heartbeat_and_the_checkpoint_outlives_the_attempt(client):
    created = client.create("prog", traceparent=TRACE)
    assert created.traceparent is not None and created.traceparent.split("-")[1] == TRACE.split("-")[1]
    [claimed] = client.claim(["prog"])
    assert claimed.traceparent == created.traceparent and claimed.checkpoint is None
    beat = client.heartbeat(claimed, progress={"percent": 50, "message": "half"}, checkpoint={"page": 3})
    assert beat.progress["percent"] == 50 and beat.progress["message"] == "half"
    assert beat.checkpoint == {"page": 3}
    with pytest.raises(Invalid) as invalid:
        client.heartbeat(claimed, progress={"percent": 101})
    assert "progress" in str(invalid.value.fields)
    client.fail(claimed, error="crashed", retry_in_seconds=0)
    [again] = client.claim(["prog"], wait_seconds=5)
    assert again.id == created.id and again.checkpoint == {"page": 3}


def test_get_with_wait_seconds_answers_when_the_todo_is_done(client):
    created = client.create("awaited")
    [claimed] = client.claim(["awaited"])
    assert client.get(created, wait_seconds=0.3).state == "claimed"  # time up: the todo as it is
    done = threading.Timer(0.5, lambda: client.complete(claimed, result={"answer": 42}))
    done.start()
    started = time.monotonic()
    awaited = client.get(created.id, wait_seconds=15)
    assert awaited.state == "done" and awaited.result == {"answer": 42}
    assert time.monotonic() - started < 10
    done.join()


def test_a_token_wait_is_resolved_once_by_its_token(client):
    created = client.create("tok")
    [claimed] = client.claim(["tok"])
    waiting = client.wait(claimed, token=True, timeout_seconds=3600)
    assert isinstance(waiting, WaitingTodo) and waiting.state == "waiting" and waiting.lease_id is None
    assert waiting.waiting_for == {"token": True} and waiting.waitpoint is not None
    assert waiting.waitpoint.resolve_url.endswith(f"/waitpoints/{waiting.waitpoint.token}/resolve/")
    assert [q.waiting for q in client.queues() if q.queue == "tok"] == [1]
    assert client.claim(["tok"]) == []
    with Client(client.url, None) as anyone:  # the token is the only credential
        assert anyone.resolve_waitpoint(waiting.waitpoint.token, data={"approved": True}).resolved
        with pytest.raises(Conflict):
            anyone.resolve_waitpoint(waiting.waitpoint.token)
        with pytest.raises(NotFound):
            anyone.resolve_waitpoint("wpt_unknown")
    [resumed] = client.claim(["tok"])
    assert resumed.id == created.id and resumed.resolution["by"] == "token"
    assert resumed.resolution["data"] == {"approved": True}


def test_a_wait_for_todos_resumes_when_they_finish(client):
    child = client.create("kids")
    client.create("parent")
    [parent] = client.claim(["parent"])
    waiting = client.wait(parent, todos=[child], timeout_seconds=600, on_timeout="fail")
    assert waiting.waiting_for == {"todos": [child.id]} and waiting.waitpoint is None
    [kid] = client.claim(["kids"])
    client.complete(kid, result={"n": 1})
    [resumed] = client.claim(["parent"], wait_seconds=5)
    assert resumed.resolution["by"] == "todos" and resumed.resolution["todos"][0]["result"] == {"n": 1}
    with pytest.raises(TypeError):
        client.wait(resumed, todos=[child], token=True, timeout_seconds=60)
    with pytest.raises(NotFound):
        client.wait(resumed, todos=["td_nope"], timeout_seconds=60)


def test_an_event_wait_is_resolved_by_an_agent_or_times_out_into_a_failure(server, agent, make_agent):
    # The source is routed into the agent's scopes (issue 28: else 404); the resolver is named by the wait.
    Route.objects.create(source=Source.objects.create(slug="github", provider="github", secret="s"), queue="ev.wait")
    reviewer = make_agent("reviewer")

    async def waits() -> str:
        async with AsyncClient(server.base, agent.token) as client, AsyncClient(server.base, reviewer.token) as other:
            await client.create("ev.wait")
            [claimed] = await client.claim(["ev.wait"])
            event = {"source": "github", "type": "check_suite", "match": {"check_suite.head_sha": "4f2a"}}
            waiting = await client.wait(claimed, event=event, timeout_seconds=3600, resolvers=["reviewer"])
            assert waiting.state == "waiting" and waiting.waiting_for["event"]["source"] == "github"
            with pytest.raises(Forbidden):
                await client.resolve(waiting)  # never the waiting agent itself
            resolved = await other.resolve(waiting, data={"skip": True})
            assert resolved.state == "pending" and resolved.resolution["by"] == "agent"
            with pytest.raises(Conflict) as conflict:
                await other.resolve(waiting)
            assert conflict.value.state == "pending"

            [claimed] = await client.claim(["ev.wait"])
            await client.wait(claimed, event=event, timeout_seconds=1, on_timeout="fail")
            return claimed.id

    todo_id = asyncio.run(waits())
    time.sleep(1.2)
    assert queue.time_out_waits(batch=10) == 1  # the reaper's sweep
    with Client(server.base, agent.token) as client:
        timed_out = client.get(todo_id)
    assert timed_out.state == "failed" and timed_out.resolution["timed_out"]


def test_a_batch_creates_todos_that_depend_on_each_other_all_or_nothing(client):
    outcomes = client.create_many(
        [
            {"queue": "deps", "kind": "lint", "idempotency_key": "lint"},
            {"queue": "deps", "kind": "test"},
            {"queue": "deps", "kind": "merge", "depends_on_index": [0, 1], "on_dependency_failure": "run"},
        ]
    )
    assert all(isinstance(o, CreateOutcome) and o.created for o in outcomes)
    assert [o.state for o in outcomes] == ["pending", "pending", "waiting"]
    lint, test, merge = (o.id for o in outcomes)
    again = client.create_many([{"queue": "deps", "kind": "lint", "idempotency_key": "lint"}])
    assert again[0].id == lint and again[0].status == 200 and not again[0].created
    with pytest.raises(Invalid) as invalid:
        client.create_many([{"queue": "deps"}, {"queue": "deps", "priority": 1000}])
    assert "todos.1.priority" in invalid.value.fields
    after = client.create("deps", kind="deploy", depends_on=[merge])
    assert after.state == "waiting" and [d.id for d in after.dependencies] == [merge]
    for todo in client.claim(["deps"], limit=10):
        client.complete(todo, result={"kind": todo.kind})
    waiting = client.get(merge)
    assert waiting.state == "pending" and waiting.on_dependency_failure == "run"
    assert [(d.id, d.state, d.result) for d in waiting.dependencies] == [
        (lint, "done", {"kind": "lint"}),
        (test, "done", {"kind": "test"}),
    ]


def test_a_fleet_parks_a_named_limit_on_a_429_and_an_operator_lifts_it(server, make_agent):
    manager = make_agent("manager", can_manage_queues=True)
    with Client(server.base, manager.token) as client:
        assert client.put_limit("openai", max_claimed=8).max_claimed == 8
        made = [client.create("llm.q", title=f"t{i}", limits=["openai"]) for i in range(2)]
        assert made[0].limits == ["openai"]
        [held] = client.claim(["llm.q"])
        until = datetime.now(UTC) + timedelta(hours=1)
        back = client.release(held, park={"limit": "openai", "until": until, "reason": "429"})
        assert back.state == "pending" and back.attempt == 0
        assert client.get(held.id).blocked["limit"] == "openai"
        assert client.limit("openai").parked["reason"] == "429"
        assert client.claim(["llm.q"]) == []
        assert client.unpark("openai").parked is None
        assert len(client.claim(["llm.q"], limit=5)) == 2
        assert client.delete_limit("openai").name == "openai"
