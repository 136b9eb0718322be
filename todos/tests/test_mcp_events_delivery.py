"""MCP Events webhook delivery beyond the first pass (issue 33), against the sketch's text
(modelcontextprotocol/experimental-ext-triggers-events, docs/design-sketch-proposal.md): the ``gap`` control
envelope when a subscription's cursor fell behind retention, dual signatures in a secret rotation's grace
window, and suspension after sustained failures with ``deliveryStatus.lastError`` and a refresh that
reactivates it. Raw JSON-RPC against a live server; receivers verify with the standardwebhooks library."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import standardwebhooks
from django.test import override_settings
from django.utils import timezone

from todos.event_feed import Position
from todos.limits import EVENTS_SECRET_ROTATION_GRACE_SECONDS
from todos.models import EventSubscription, Todo
from todos.notices import NOTIFY_QUEUE
from todos.tests.outbound_receivers import Receiver
from todos.tests.test_mcp_events import SECRET, bridged, deliveries, finish, hook, send_round, subscribe

__all__ = ["bridged", "hook"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)


def delivered_todo_ids(hook: Receiver) -> list[str]:
    """The todo ids of the events the receiver got, in order (a gap envelope carries none)."""
    return [json.loads(r.body).get("data", {}).get("todoId") for r in deliveries(hook)]


def rounds_until(hook: Receiver, done: Callable[[], bool]) -> None:
    """Sidecar rounds until ``done()`` (an event is read once the watermark passes it: a moment later)."""
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.1)
        send_round(hook)
        if done() or time.monotonic() > deadline:
            return


NEW_SECRET = "whsec_" + "c2Vjb25kIHNlY3JldCBvZiAyNCBieXRlcyEh"  # 26 bytes, base64


def test_a_cursor_behind_retention_sends_a_signed_gap_envelope_then_the_events(bridged, hook, agent, settings):
    answer = subscribe(bridged, agent.token, hook.url + "/hooks/gap")["result"]
    stale = Position(timezone.now() - timedelta(seconds=settings.EVENTS_RETENTION_SECONDS + 3600))
    EventSubscription.objects.filter(pk=answer["id"]).update(cursor=stale.encode())
    done = finish("jobs", agent)
    rounds_until(hook, lambda: len(deliveries(hook)) >= 2)
    bodies = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in deliveries(hook)]
    [gap] = [b for b in bodies if b.get("type") == "gap"]
    [gap_request] = [r for r in deliveries(hook) if b"gap" in r.body]
    assert set(gap) == {"type", "cursor"} and gap_request.headers["webhook-id"].startswith("msg_gap_")
    assert gap_request.headers["x-mcp-subscription-id"] == answer["id"]
    assert Position(timezone.now()).encode() > gap["cursor"] > stale.encode()
    assert [b["data"]["todoId"] for b in bodies if "eventId" in b] == [done.id]
    send_round(hook)  # the cursor moved: no second gap
    assert sum(b"gap" in r.body for r in deliveries(hook)) == 1


def test_a_rotated_secret_signs_beside_the_old_one_for_the_grace_window(bridged, hook, agent):
    url = hook.url + "/hooks/rotate"
    first = subscribe(bridged, agent.token, url)["result"]
    refreshed = subscribe(bridged, agent.token, url, secret=NEW_SECRET, cursor=first["cursor"])["result"]
    assert refreshed["id"] == first["id"]
    finish("jobs", agent)
    rounds_until(hook, lambda: len(deliveries(hook)) >= 1)
    [during] = deliveries(hook)
    assert during.headers["webhook-signature"].count("v1,") == 2
    assert standardwebhooks.Webhook(NEW_SECRET).verify(during.body, during.headers)
    assert standardwebhooks.Webhook(SECRET).verify(during.body, during.headers)  # a receiver not yet switched
    # After the grace window only the new secret signs.
    ended = timezone.now() - timedelta(seconds=EVENTS_SECRET_ROTATION_GRACE_SECONDS + 1)
    EventSubscription.objects.filter(pk=first["id"]).update(secret_rotated_at=ended)
    finish("jobs", agent)
    rounds_until(hook, lambda: len(deliveries(hook)) >= 2)
    after = deliveries(hook)[1]
    assert after.headers["webhook-signature"].count("v1,") == 1
    assert standardwebhooks.Webhook(NEW_SECRET).verify(after.body, after.headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(after.body, after.headers)


def test_sustained_failures_suspend_delivery_and_a_refresh_reactivates_it(bridged, hook, agent):
    url = hook.url + "/hooks/down"
    first = subscribe(bridged, agent.token, url)["result"]
    hook.status = 503  # the endpoint goes down after it was verified
    with override_settings(EVENTS_SUSPEND_AFTER_FAILURES=2):
        finish("jobs", agent)
        finish("jobs", agent)
        # Two events, each attempt failed: the second failure suspends.
        rounds_until(hook, lambda: not EventSubscription.objects.get(pk=first["id"]).active)
    row = EventSubscription.objects.get(pk=first["id"])
    assert (row.active, row.failures, row.last_error) == (False, 2, "http_5xx") and row.failed_since is not None
    held = finish("jobs", agent)
    time.sleep(0.5)
    # Suspended: nothing new is enqueued, the cursor waits. (A delivery queued before the suspension keeps its
    # retries, so the receiver may see one of the first two events again: never the new one.)
    send_round(hook)
    assert held.id not in delivered_todo_ids(hook)
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE, payload__body__data__todoId=held.id).exists()
    refreshed = subscribe(bridged, agent.token, url, cursor=first["cursor"])["result"]
    status = refreshed["deliveryStatus"]
    assert status["active"] is False and status["lastError"] == "http_5xx" and status["failedSince"]
    assert EventSubscription.objects.get(pk=first["id"]).active is True  # the refresh reactivated it
    hook.status = 200
    rounds_until(hook, lambda: held.id in delivered_todo_ids(hook))
    bodies = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in deliveries(hook)]
    assert [b["data"]["todoId"] for b in bodies].count(held.id) == 1
    healthy = subscribe(bridged, agent.token, url, cursor=refreshed["cursor"])["result"]["deliveryStatus"]
    assert healthy["active"] is True and healthy["lastError"] is None and "failedSince" not in healthy
