"""Attacks on MCP Events (issue 33 item 2; docs/security.md's table names each test): another scope's events,
webhooks to the inside, subscription floods, another agent's subscription. Raw JSON-RPC against a live
server, as an agent with a compromised token would send it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
import standardwebhooks
from django.test import override_settings
from django.utils import timezone

from todos import event_feed, queue
from todos.event_feed import Position
from todos.models import Agent, EventSubscription
from todos.tests.mcp_live import UVICORN, live_server, mcp_base
from todos.tests.outbound_receivers import Receiver, running_receiver
from todos.tests.test_mcp_events import SECRET, Stream, deliveries, finish, rpc

__all__ = ["mcp_base"]

pytestmark = pytest.mark.django_db(transaction=True)


def stream_answer(base: str, token: str, params: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "events/stream", "params": params}
    response = requests.post(base + "/mcp", json=body, headers=headers, timeout=30)
    assert response.headers["content-type"].startswith("application/json")
    answer: dict[str, Any] = response.json()
    return answer


def webhook(url: str, **more: Any) -> dict[str, Any]:
    return {
        "name": more.pop("name", "todo.finished"),
        "arguments": more.pop("arguments", {}),
        "delivery": {"mode": "webhook", "url": url, "secret": more.pop("secret", SECRET)},
        **more,
    }


def test_events_of_a_queue_outside_the_scopes_are_forbidden_in_every_mode(mcp_base, make_agent):
    narrow = make_agent("narrow", claim=["jobs"], create=["jobs"])
    for name in ("todo.ready", "todo.finished", "wait.resolved"):
        for queue_arg in ("secret", "se*", "_switchboard.notify"):
            params = {"name": name, "arguments": {"queue": queue_arg}, "cursor": None}
            polled = rpc(mcp_base, narrow.token, "events/poll", params)
            assert polled["error"]["code"] == -32012, (name, queue_arg, polled)
            assert polled["error"]["data"]["field"] == "arguments.queue"
            assert stream_answer(mcp_base, narrow.token, params)["error"]["code"] == -32012
            hooked = rpc(mcp_base, narrow.token, "events/subscribe", webhook("https://93.184.216.34/h", **params))
            assert hooked["error"]["code"] == -32012
    assert not EventSubscription.objects.exists()


def test_a_queue_glob_of_many_wildcards_is_invalid_params(mcp_base, agent):
    params = {"name": "todo.ready", "arguments": {"queue": "*a" * 20 + "?"}, "cursor": None}
    answer = rpc(mcp_base, agent.token, "events/poll", params)
    assert answer["error"]["code"] == -32602 and answer["error"]["data"]["field"] == "arguments.queue"


def test_todo_ready_needs_a_claim_scope_not_a_create_scope(mcp_base, make_agent):
    producer = make_agent("producer", claim=["mine"], create=["jobs"])
    params = {"name": "todo.ready", "arguments": {"queue": "jobs"}, "cursor": None}
    assert rpc(mcp_base, producer.token, "events/poll", params)["error"]["code"] == -32012


def test_no_event_reaches_an_agent_for_a_todo_outside_its_scopes(mcp_base, make_agent):
    narrow = make_agent("narrow", claim=["jobs"], create=["jobs"])
    boss = make_agent("boss")
    cursor = Position(timezone.now() - timedelta(seconds=10)).encode()
    hidden = finish("secret", boss)  # named by id, and unnamed: neither shows
    queue.create(queue="secret", title="ready elsewhere")
    queue.create(queue="_switchboard.notify", title="a system delivery")
    for name, arguments in (
        ("todo.finished", {}),
        ("todo.finished", {"todos": [hidden.id]}),
        ("todo.ready", {}),
        ("todo.ready", {"queue": "*"}),  # a glob wider than the scopes reads only the scopes
        ("wait.resolved", {}),
    ):
        params = {"name": name, "arguments": arguments, "cursor": cursor, "timeoutMs": 0}
        assert rpc(mcp_base, narrow.token, "events/poll", params)["result"]["events"] == [], (name, arguments)


def test_wait_resolved_shows_only_the_callers_own_waits(mcp_base, make_agent):
    alice = make_agent("alice2")
    bob = make_agent("bob2")
    cursor = rpc(mcp_base, alice.token, "events/poll", {"name": "wait.resolved", "cursor": None})["result"]["cursor"]
    todo, _ = queue.create(queue="jobs", title="bob's")
    claimed = queue.claim(todo.id, agent=bob)
    assert claimed.lease_id
    _, token = queue.wait(todo.id, agent=bob, lease_id=claimed.lease_id, wait_for={"token": True}, timeout_seconds=60)
    assert token
    queue.resolve_token(token)
    params = {"name": "wait.resolved", "cursor": cursor, "timeoutMs": 1500}
    assert rpc(mcp_base, alice.token, "events/poll", params)["result"]["events"] == []


@pytest.fixture(scope="module")
def guarded(django_db_setup: None) -> Iterator[str]:
    """A live server with the SSRF guard on, as in production (the suite's settings allow loopback)."""
    os.environ["OUTBOUND_GUARD_ON"] = "1"
    try:
        with live_server(UVICORN) as base:
            yield base
    finally:
        del os.environ["OUTBOUND_GUARD_ON"]


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://[::1]/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://10.0.0.1/hook",
        "https://localhost/hook",
        "file:///etc/passwd",
    ],
)
def test_a_webhook_to_the_inside_is_refused_at_subscribe_naming_the_field(guarded, agent, url):
    answer = rpc(guarded, agent.token, "events/subscribe", webhook(url))
    assert answer["error"]["code"] == -32602 and answer["error"]["data"]["field"] == "delivery.url"
    assert not EventSubscription.objects.exists()


def test_a_webhook_in_clear_or_with_a_weak_secret_is_refused(mcp_base, agent):
    plain = rpc(mcp_base, agent.token, "events/subscribe", webhook("http://93.184.216.34/hook"))
    assert plain["error"]["code"] == -32602 and plain["error"]["data"]["field"] == "delivery.url"
    for secret in ("hunter2", "whsec_c2hvcnQ=", "whsec_" + "A" * 200, None, "whsec_!!!!"):
        weak = rpc(mcp_base, agent.token, "events/subscribe", webhook("https://93.184.216.34/hook", secret=secret))
        assert weak["error"]["code"] == -32602 and weak["error"]["data"]["field"] == "delivery.secret", secret
    assert not EventSubscription.objects.exists()


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with running_receiver() as recv:
        recv.status = 200
        recv.echo_challenge = True
        yield recv


@pytest.fixture
def capped(hook: Receiver, django_db_setup: None) -> Iterator[str]:
    """A live server that allows the loopback receiver exactly, with two subscriptions per agent at most."""
    env = {"OUTBOUND_ALLOW_HOSTS": f"127.0.0.1:{hook.port}", "EVENTS_MAX_SUBSCRIPTIONS_PER_AGENT": "2"}
    os.environ.update(env)
    try:
        with live_server(UVICORN) as base:
            yield base
    finally:
        for key in env:
            del os.environ[key]


def test_too_many_subscriptions_is_resource_exhausted_and_a_refresh_is_not_counted(capped, hook, agent):
    for path in ("a", "b"):
        assert "result" in rpc(capped, agent.token, "events/subscribe", webhook(f"{hook.url}/{path}"))
    third = rpc(capped, agent.token, "events/subscribe", webhook(f"{hook.url}/c"))
    assert third["error"]["code"] == -32013 and third["error"]["data"] == {"limit": "subscriptions", "max": 2}
    assert "/c" not in [r.path for r in hook.requests]  # refused before its endpoint was sent a challenge
    assert "result" in rpc(capped, agent.token, "events/subscribe", webhook(f"{hook.url}/a"))  # a refresh
    assert EventSubscription.objects.filter(agent=agent).count() == 2


def test_a_webhook_to_an_endpoint_that_did_not_ask_for_it_is_never_delivered(capped, hook, agent):
    hook.echo_challenge = False  # a victim's URL: it answers 200, but does not echo the challenge
    answer = rpc(capped, agent.token, "events/subscribe", webhook(f"{hook.url}/victim"))
    assert answer["error"]["code"] == -32015 and answer["error"]["data"] == {"reason": "challenge_failed"}
    finish("jobs", agent)
    _round(hook)
    assert len(hook.requests) == 1  # the one signed challenge; no event, nothing stored
    assert not EventSubscription.objects.exists()


def test_another_agent_cannot_unsubscribe_or_take_over_a_subscription(capped, hook, make_agent):
    alice = make_agent("alice3")
    mallory = make_agent("mallory")
    mine = rpc(capped, alice.token, "events/subscribe", webhook(f"{hook.url}/a"))["result"]
    key = {"name": "todo.finished", "arguments": {}, "delivery": {"url": f"{hook.url}/a"}}
    assert rpc(capped, mallory.token, "events/unsubscribe", key)["error"]["code"] == -32011
    other = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"  # mallory's own secret for the same URL
    theirs = rpc(capped, mallory.token, "events/subscribe", webhook(f"{hook.url}/a", secret=other))["result"]
    assert theirs["id"] != mine["id"]  # a different subscription: alice's secret is untouched
    assert EventSubscription.objects.get(pk=mine["id"]).secret == SECRET


def _round(hook: Receiver) -> None:
    from todos.management.commands.notify import drain, notify_agent

    with override_settings(OUTBOUND_ALLOW_HOSTS=[f"127.0.0.1:{hook.port}"]):
        event_feed.enqueue_webhooks()
        drain(notify_agent())


def test_a_subscription_ends_when_its_agent_loses_the_scope_or_is_deactivated(capped, hook, make_agent):
    alice: Agent = make_agent("alice4")
    rpc(capped, alice.token, "events/subscribe", webhook(f"{hook.url}/a", arguments={"queue": "jobs"}))
    rpc(capped, alice.token, "events/subscribe", webhook(f"{hook.url}/b"))
    alice.claim_scopes = alice.create_scopes = ["other"]
    alice.save()
    finish("jobs", make_agent("worker"))
    _round(hook)
    assert list(EventSubscription.objects.values_list("url", flat=True)) == [f"{hook.url}/b"]
    # No event: the narrowed subscription gets the sketch's signed "terminated" envelope, the other sees no
    # "jobs" todo.
    assert [r.path for r in deliveries(hook)] == ["/a"]
    ended = standardwebhooks.Webhook(SECRET).verify(deliveries(hook)[0].body, deliveries(hook)[0].headers)
    assert ended["type"] == "terminated" and ended["error"]["code"] == -32012
    assert deliveries(hook)[0].headers["webhook-id"].startswith("msg_terminated_")
    Agent.objects.filter(pk=alice.pk).update(is_active=False)
    _round(hook)
    assert not EventSubscription.objects.exists()
    assert [r.path for r in deliveries(hook)] == ["/a", "/b"]


def test_a_push_stream_ends_when_its_agent_is_deactivated(mcp_base, make_agent):
    alice: Agent = make_agent("alice5")
    stream = Stream(mcp_base, alice.token, {"name": "todo.finished", "arguments": {}, "cursor": None})
    try:
        stream.wait_for("notifications/events/active")
        Agent.objects.filter(pk=alice.pk).update(is_active=False)
        ended = stream.wait_for("notifications/events/terminated")[0]["params"]
        assert ended["error"]["code"] == -32012
        finish("jobs", make_agent("worker"))
        time.sleep(2)
        assert not [m for m in stream.messages if m.get("method") == "notifications/events/event"]
    finally:
        stream.close()


@pytest.mark.parametrize("revoke", ["deactivated", "scope removed"])
def test_a_held_poll_ends_when_its_agent_is_deactivated_or_loses_the_scope(mcp_base, make_agent, revoke):
    import threading

    alice: Agent = make_agent("alice6")
    params = {"name": "todo.finished", "arguments": {"queue": "jobs"}}
    start = rpc(mcp_base, alice.token, "events/poll", {**params, "cursor": None})["result"]["cursor"]
    answers: list[dict[str, Any]] = []
    held = {**params, "cursor": start, "timeoutMs": 20_000}
    poller = threading.Thread(target=lambda: answers.append(rpc(mcp_base, alice.token, "events/poll", held)))
    began = time.monotonic()
    poller.start()
    time.sleep(1.5)  # the poll is held, waiting for an event
    if revoke == "deactivated":
        Agent.objects.filter(pk=alice.pk).update(is_active=False)
    else:
        Agent.objects.filter(pk=alice.pk).update(claim_scopes=["other"], create_scopes=["other"])
    finish("jobs", make_agent("worker"))  # an event it may no longer see
    poller.join(timeout=15)
    assert not poller.is_alive() and time.monotonic() - began < 10  # re-checked mid-wait, not at its end
    [answer] = answers
    assert "result" not in answer and answer["error"]["code"] == -32012


def test_delivery_status_names_a_category_never_the_endpoints_answer(capped, hook, agent):
    url = f"{hook.url}/oracle"
    first = rpc(capped, agent.token, "events/subscribe", webhook(url))["result"]
    hook.status = 401  # an inside service's answer the agent would like to read back
    with override_settings(EVENTS_SUSPEND_AFTER_FAILURES=1):
        finish("jobs", agent)
        deadline = time.monotonic() + 10
        while not deliveries(hook) and time.monotonic() < deadline:  # until the watermark passes the event
            time.sleep(0.1)
            _round(hook)
    refreshed = rpc(capped, agent.token, "events/subscribe", webhook(url, cursor=first["cursor"]))["result"]
    assert refreshed["deliveryStatus"]["lastError"] == "http_4xx" and refreshed["deliveryStatus"]["active"] is False
    assert set(refreshed["deliveryStatus"]) == {"active", "lastDeliveryAt", "lastError", "failedSince"}
    assert "401" not in str(refreshed)
