"""MCP Events (issue 33 item 2) in raw JSON-RPC against a live uvicorn server on switchboard.asgi, against
the sketch's text (modelcontextprotocol/experimental-ext-triggers-events, docs/design-sketch-proposal.md):
events/list, events/poll with cursors, push on events/stream, webhooks verified with the standardwebhooks
library, a reconnect that misses nothing, unsubscribe and TTL expiry. FastMCP's client (4.2.3) implements
no events, so there is no client test to run with it."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import requests
import standardwebhooks
from django.test import override_settings
from django.utils import timezone

from todos import event_feed, queue
from todos.event_feed import Position
from todos.management.commands.notify import drain, notify_agent
from todos.mcp.events import EXTENSION
from todos.models import Agent, EventSubscription, Todo
from todos.notices import NOTIFY_QUEUE
from todos.tests.mcp_live import UVICORN, live_server, mcp_base
from todos.tests.outbound_receivers import Receiver, running_receiver

__all__ = ["mcp_base"]

pytestmark = pytest.mark.django_db(transaction=True)

VERSION = "2025-11-25"
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 24 bytes, base64


def rpc(base: str, token: str, method: str, params: dict[str, Any], *, timeout: float = 60) -> dict[str, Any]:
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    response = requests.post(base + "/mcp", json=body, headers=headers, timeout=timeout)
    answer: dict[str, Any] = response.json()
    return answer


def finish(queue_name: str, agent: Agent) -> Todo:
    todo, _ = queue.create(queue=queue_name, title="t")
    claimed = queue.claim(todo.id, agent=agent)
    assert claimed.lease_id is not None
    return queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id, result={"ok": True})


def poll(base: str, token: str, name: str, cursor: str | None, **more: Any) -> dict[str, Any]:
    answer = rpc(
        base, token, "events/poll", {"name": name, "arguments": more.pop("arguments", {}), "cursor": cursor, **more}
    )
    assert "result" in answer, answer
    return dict(answer["result"])


def test_initialize_declares_the_extension_to_a_client_that_declares_it(mcp_base, agent):
    params = {
        "protocolVersion": VERSION,
        "capabilities": {"extensions": {EXTENSION: {}}},
        "clientInfo": {"name": "events-client", "version": "0"},
    }
    result = rpc(mcp_base, agent.token, "initialize", params)["result"]
    assert result["capabilities"]["extensions"][EXTENSION] == {}
    assert result["capabilities"]["events"] == {"listChanged": False}
    plain = rpc(mcp_base, agent.token, "initialize", {**params, "capabilities": {}})["result"]
    assert EXTENSION not in plain["capabilities"].get("extensions", {}) and "events" not in plain["capabilities"]


def test_events_list_names_the_three_types_with_every_delivery_mode(mcp_base, agent):
    listed = rpc(mcp_base, agent.token, "events/list", {})["result"]["events"]
    assert {e["name"] for e in listed} == {"todo.ready", "todo.finished", "wait.resolved"}
    for event in listed:
        assert event["delivery"] == ["poll", "push", "webhook"]
        assert event["inputSchema"]["type"] == "object" and event["payloadSchema"]["type"] == "object"


def test_poll_with_a_null_cursor_starts_from_now_then_the_cursor_returns_what_finished_since(mcp_base, agent):
    finish("jobs", agent)  # before the subscription: never shown
    first = poll(mcp_base, agent.token, "todo.finished", None)
    assert first["events"] == [] and first["cursor"] and first["hasMore"] is False and first["truncated"] is False
    assert first["nextPollMs"] >= 1000
    done = finish("jobs", agent)
    second = poll(mcp_base, agent.token, "todo.finished", first["cursor"], timeoutMs=5000)
    assert [e["data"] for e in second["events"]] == [{"todoId": done.id, "queue": "jobs", "kind": "", "state": "done"}]
    event = second["events"][0]
    assert event["name"] == "todo.finished" and event["eventId"] and event["timestamp"].endswith("Z")
    third = poll(mcp_base, agent.token, "todo.finished", second["cursor"], timeoutMs=0)
    assert third["events"] == []  # the cursor moved past it


def test_a_held_poll_answers_as_soon_as_an_event_happens(mcp_base, agent):
    cursor = poll(mcp_base, agent.token, "todo.finished", None)["cursor"]
    answer: dict[str, Any] = {}

    def held() -> None:
        answer.update(poll(mcp_base, agent.token, "todo.finished", cursor, timeoutMs=15000))

    started = time.monotonic()
    thread = threading.Thread(target=held)
    thread.start()
    time.sleep(1.0)
    done = finish("jobs", agent)
    thread.join(20)
    assert [e["data"]["todoId"] for e in answer["events"]] == [done.id]
    assert time.monotonic() - started < 10


def test_max_events_pages_with_has_more_and_an_intermediate_cursor(mcp_base, agent):
    cursor = poll(mcp_base, agent.token, "todo.finished", None)["cursor"]
    ids = [finish("jobs", agent).id for _ in range(3)]
    seen: list[str] = []
    for _ in range(5):
        page = poll(mcp_base, agent.token, "todo.finished", cursor, maxEvents=2, timeoutMs=3000)
        seen += [e["data"]["todoId"] for e in page["events"]]
        cursor = page["cursor"]
        if not page["hasMore"] and len(seen) == 3:
            break
    assert sorted(seen) == sorted(ids)


def test_todo_finished_narrowed_to_the_todos_it_awaits(mcp_base, agent):
    cursor = poll(mcp_base, agent.token, "todo.finished", None)["cursor"]
    awaited, _ = queue.create(queue="jobs", title="awaited")
    finish("jobs", agent)  # not awaited
    claimed = queue.claim(awaited.id, agent=agent)
    assert claimed.lease_id
    queue.complete(awaited.id, agent=agent, lease_id=claimed.lease_id, result=None)
    page = poll(mcp_base, agent.token, "todo.finished", cursor, arguments={"todos": [awaited.id]}, timeoutMs=5000)
    assert [e["data"]["todoId"] for e in page["events"]] == [awaited.id]


def test_todo_ready_is_one_event_per_queue_per_window(mcp_base, agent):
    cursor = Position(timezone.now() - timedelta(seconds=10)).encode()  # a cursor the server gave 10 s ago
    for _ in range(3):
        queue.create(queue="jobs", title="work")
    queue.create(queue="other", title="work")
    page = poll(mcp_base, agent.token, "todo.ready", cursor, timeoutMs=3000)
    assert sorted((e["data"]["queue"], e["data"]["count"]) for e in page["events"]) == [("jobs", 3), ("other", 1)]
    narrowed = poll(mcp_base, agent.token, "todo.ready", cursor, arguments={"queue": "jobs"}, timeoutMs=3000)
    assert [e["data"]["queue"] for e in narrowed["events"]] == ["jobs"]
    # The next window is at least the interval long: nothing more within it, however many todos come.
    queue.create(queue="jobs", title="more")
    again = poll(mcp_base, agent.token, "todo.ready", page["cursor"], timeoutMs=0)
    assert again["events"] == []


def test_wait_resolved_tells_the_waiter(mcp_base, agent):
    cursor = poll(mcp_base, agent.token, "wait.resolved", None)["cursor"]
    todo, _ = queue.create(queue="jobs", title="ask")
    claimed = queue.claim(todo.id, agent=agent)
    assert claimed.lease_id
    _, token = queue.wait(
        todo.id, agent=agent, lease_id=claimed.lease_id, wait_for={"token": True}, timeout_seconds=600
    )
    assert token
    queue.resolve_token(token, data={"approved": True})
    page = poll(mcp_base, agent.token, "wait.resolved", cursor, timeoutMs=5000)
    assert [e["data"] for e in page["events"]] == [{"todoId": todo.id, "queue": "jobs"}]


def test_a_stale_cursor_with_max_age_is_truncated(mcp_base, agent):
    stale = Position(timezone.now() - timedelta(hours=2)).encode()
    page = poll(mcp_base, agent.token, "todo.finished", stale, maxAgeMs=60000, timeoutMs=0)
    assert page["truncated"] is True


def test_a_cursor_this_server_did_not_mint_is_invalid_params(mcp_base, agent):
    answer = rpc(mcp_base, agent.token, "events/poll", {"name": "todo.finished", "cursor": "historyId_1"})
    assert answer["error"]["code"] == -32602 and answer["error"]["data"]["field"] == "cursor"
    unknown = rpc(mcp_base, agent.token, "events/poll", {"name": "email.received", "cursor": None})
    assert unknown["error"]["code"] == -32011 and unknown["error"]["data"]["kind"] == "event"


# --- push: events/stream ---


class Stream:
    """An events/stream request's SSE answer, read message by message in a thread."""

    def __init__(self, base: str, token: str, params: dict[str, Any], request_id: int = 7) -> None:
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
        }
        body = {"jsonrpc": "2.0", "id": request_id, "method": "events/stream", "params": params}
        self.response = requests.post(base + "/mcp", json=body, headers=headers, stream=True, timeout=60)
        self.messages: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self.response.iter_lines():
                if line.startswith(b"data: "):
                    self.messages.append(json.loads(line[6:]))
        except (requests.RequestException, AttributeError, ValueError):
            pass

    def wait_for(self, method: str, count: int = 1, seconds: float = 15) -> list[dict[str, Any]]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [m for m in self.messages if m.get("method") == method]
            if len(found) >= count:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {count} {method} in {self.messages}")

    def close(self) -> None:
        self.response.close()


def test_push_streams_events_with_cursors_and_a_reconnect_misses_nothing(mcp_base, agent):
    stream = Stream(mcp_base, agent.token, {"name": "todo.finished", "arguments": {}, "cursor": None})
    try:
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        active = stream.wait_for("notifications/events/active")[0]["params"]
        assert active["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7} and active["truncated"] is False
        first = finish("jobs", agent)
        event = stream.wait_for("notifications/events/event")[0]["params"]
        assert event["data"]["todoId"] == first.id and event["cursor"]
        assert event["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7}
        cursor = event["cursor"]
    finally:
        stream.close()
    # Disconnected: two todos finish. Reconnecting with the last cursor delivers both, and nothing before.
    missed = {finish("jobs", agent).id, finish("jobs", agent).id}
    again = Stream(mcp_base, agent.token, {"name": "todo.finished", "arguments": {}, "cursor": cursor})
    try:
        events = again.wait_for("notifications/events/event", count=2)
        assert {e["params"]["data"]["todoId"] for e in events} == missed
    finally:
        again.close()


def test_a_refused_stream_is_a_json_rpc_error_and_no_stream(mcp_base, make_agent):
    narrow = make_agent("narrow", claim=["jobs"])
    headers = {"Authorization": f"Bearer {narrow.token}", "Accept": "application/json, text/event-stream"}
    body = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "events/stream",
        "params": {"name": "todo.ready", "arguments": {"queue": "secret"}},
    }
    response = requests.post(mcp_base + "/mcp", json=body, headers=headers, timeout=30)
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == -32012 and response.json()["id"] == 3


# --- webhooks ---


@pytest.fixture
def hook() -> Iterator[Receiver]:
    """A receiver that proves its intent: it echoes a verification envelope's challenge."""
    with running_receiver() as recv:
        recv.status = 200
        recv.echo_challenge = True
        yield recv


def deliveries(hook: Receiver) -> list[Any]:
    """What the receiver got besides verification envelopes."""
    return [r for r in hook.requests if not r.headers["webhook-id"].startswith("msg_verification_")]


@pytest.fixture
def bridged(hook: Receiver, django_db_setup: None) -> Iterator[str]:
    """A live server whose operator allows the loopback receiver exactly (OUTBOUND_ALLOW_HOSTS)."""
    allowed = f"127.0.0.1:{hook.port}"
    os.environ["OUTBOUND_ALLOW_HOSTS"] = allowed
    try:
        with live_server(UVICORN) as base:
            yield base
    finally:
        del os.environ["OUTBOUND_ALLOW_HOSTS"]


def subscribe(base: str, token: str, url: str, **more: Any) -> dict[str, Any]:
    params = {
        "name": more.pop("name", "todo.finished"),
        "arguments": more.pop("arguments", {}),
        "delivery": {"mode": "webhook", "url": url, "secret": more.pop("secret", SECRET)},
        "cursor": more.pop("cursor", None),
        **more,
    }
    return rpc(base, token, "events/subscribe", params)


def send_round(hook: Receiver) -> None:
    with override_settings(OUTBOUND_ALLOW_HOSTS=[f"127.0.0.1:{hook.port}"]):
        event_feed.enqueue_webhooks()
        drain(notify_agent())


def test_webhook_subscribe_delivers_signed_events_and_unsubscribe_stops_them(bridged, hook, agent):
    url = hook.url + "/hooks/a"
    answer = subscribe(bridged, agent.token, url, ttlMs=120_000)["result"]
    assert answer["id"].startswith("sub_") and answer["cursor"] and answer["truncated"] is False
    granted = datetime.fromisoformat(answer["refreshBefore"].replace("Z", "+00:00"))
    assert granted <= timezone.now() + timedelta(seconds=121)  # at most the suggestion
    done = finish("jobs", agent)
    time.sleep(0.1)
    send_round(hook)
    assert len(deliveries(hook)) == 1
    delivered = deliveries(hook)[0]
    assert delivered.path == "/hooks/a"
    assert delivered.headers["x-mcp-subscription-id"] == answer["id"]
    verified = standardwebhooks.Webhook(SECRET).verify(delivered.body, delivered.headers)
    assert verified["data"]["todoId"] == done.id and verified["name"] == "todo.finished" and verified["cursor"]
    assert delivered.headers["webhook-id"] == verified["eventId"]
    # A refresh is idempotent: the same id, the cursor it has reached, the delivery's status.
    refreshed = subscribe(bridged, agent.token, url, cursor=answer["cursor"])["result"]
    assert refreshed["id"] == answer["id"] and refreshed["cursor"] == verified["cursor"]
    assert refreshed["deliveryStatus"]["active"] is True and refreshed["deliveryStatus"]["lastDeliveryAt"]
    gone = rpc(
        bridged, agent.token, "events/unsubscribe", {"name": "todo.finished", "arguments": {}, "delivery": {"url": url}}
    )
    assert gone["result"] == {}
    again = rpc(
        bridged, agent.token, "events/unsubscribe", {"name": "todo.finished", "arguments": {}, "delivery": {"url": url}}
    )
    assert again["error"]["code"] == -32011
    finish("jobs", agent)
    send_round(hook)
    assert len(deliveries(hook)) == 1


def test_a_webhook_subscription_lapses_at_its_ttl(bridged, hook, agent):
    answer = subscribe(bridged, agent.token, hook.url + "/hooks/b", ttlMs=1)["result"]
    granted = datetime.fromisoformat(answer["refreshBefore"].replace("Z", "+00:00"))
    assert granted > timezone.now() + timedelta(seconds=50)  # clamped up to the floor, self-announced
    EventSubscription.objects.filter(pk=answer["id"]).update(refresh_before=timezone.now() - timedelta(seconds=1))
    finish("jobs", agent)
    send_round(hook)
    assert deliveries(hook) == [] and not EventSubscription.objects.exists()


def test_webhook_events_missed_while_the_sidecar_was_down_are_sent_on_its_next_round(bridged, hook, agent):
    subscribe(bridged, agent.token, hook.url + "/hooks/c")
    ids = {finish("jobs", agent).id for _ in range(3)}
    time.sleep(0.1)
    send_round(hook)
    bodies = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in deliveries(hook)]
    assert {b["data"]["todoId"] for b in bodies} == ids
    assert len({b["eventId"] for b in bodies}) == 3


def test_a_webhook_url_is_verified_by_a_signed_challenge_before_any_delivery(bridged, hook, agent):
    url = hook.url + "/hooks/v"
    answer = subscribe(bridged, agent.token, url)["result"]
    [verification] = hook.requests
    body = standardwebhooks.Webhook(SECRET).verify(verification.body, verification.headers)
    assert body["type"] == "verification" and len(body["challenge"]) >= 32
    assert verification.headers["x-mcp-subscription-id"] == answer["id"]
    subscribe(bridged, agent.token, url)  # a refresh: verified already, no second challenge
    subscribe(bridged, agent.token, url, name="wait.resolved")  # the same (agent, url): cached
    assert len(hook.requests) == 1


def test_an_endpoint_that_does_not_echo_the_challenge_is_not_subscribed(bridged, hook, agent):
    hook.echo_challenge = False
    silent = subscribe(bridged, agent.token, hook.url + "/hooks/x")
    assert silent["error"]["code"] == -32015 and silent["error"]["data"] == {"reason": "challenge_failed"}
    hook.status = 503
    failing = subscribe(bridged, agent.token, hook.url + "/hooks/y")
    assert failing["error"]["code"] == -32015 and failing["error"]["data"] == {"reason": "http_5xx"}
    assert not EventSubscription.objects.exists()


def modern(base: str, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One 2026-07-28 request (the per-request envelope in _meta), declaring the events extension."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    if "name" in params:
        headers["Mcp-Name"] = params["name"]
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    answer: dict[str, Any] = requests.post(base + "/mcp", json=body, headers=headers, timeout=30).json()
    return answer


def test_the_2026_07_28_revision_discovers_and_polls_events(mcp_base, agent):
    discovered = modern(mcp_base, agent.token, "server/discover", {})
    assert EXTENSION in discovered["result"]["capabilities"]["extensions"], discovered
    first = modern(mcp_base, agent.token, "events/poll", {"name": "todo.finished", "cursor": None})["result"]
    done = finish("jobs", agent)
    second = modern(
        mcp_base, agent.token, "events/poll", {"name": "todo.finished", "cursor": first["cursor"], "timeoutMs": 5000}
    )
    assert [e["data"]["todoId"] for e in second["result"]["events"]] == [done.id]


def test_no_expiry_is_granted_as_the_longest_finite_ttl_and_an_absent_ttl_as_an_hour(bridged, hook, agent):
    never = subscribe(bridged, agent.token, hook.url + "/hooks/n", ttlMs=None)["result"]
    granted = datetime.fromisoformat(never["refreshBefore"].replace("Z", "+00:00"))
    assert timedelta(hours=23) < granted - timezone.now() <= timedelta(days=1)
    default = subscribe(bridged, agent.token, hook.url + "/hooks/d")["result"]
    granted = datetime.fromisoformat(default["refreshBefore"].replace("Z", "+00:00"))
    assert timedelta(minutes=59) < granted - timezone.now() <= timedelta(hours=1)


def test_an_event_the_receiver_answers_410_is_not_retried(bridged, hook, agent):
    subscribe(bridged, agent.token, hook.url + "/hooks/g")
    hook.status = 410  # the sketch: a receiver that does not want it retried
    finish("jobs", agent)
    time.sleep(0.1)
    send_round(hook)
    send_round(hook)
    assert len(deliveries(hook)) == 1
    [delivery] = Todo.objects.filter(queue=NOTIFY_QUEUE)
    assert delivery.state == "done" and delivery.result["status"] == 410
