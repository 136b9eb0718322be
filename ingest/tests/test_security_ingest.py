"""Issue 28: the webhook receiver attacked by anyone on the network, as security-review.md tried it.

Each test sends what an unauthenticated sender (or one holding a captured delivery) would, and checks
that the answer gives nothing away and that nothing was stored."""

from __future__ import annotations

import hashlib
import hmac
import importlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db.models.functions import Now
from django.test import Client

from events.models import Event
from ingest import routing, streams
from ingest.errors import InvalidDelivery
from ingest.models import Source
from ingest.tests.conftest import (
    HMAC_SECRET,
    github_headers,
    hmac_headers,
    pr_payload,
    standard_headers,
    stripe_headers,
    to_body,
)
from todos.models import Todo
from todos.tests.conftest import Api


def _refusal(response) -> tuple[int, bytes]:
    return response.status_code, response.content


def test_unknown_inactive_pull_only_and_badly_signed_slugs_answer_alike(
    github_source, make_source, make_route, post_webhook
):
    # The slug oracle (H2's first step): 401 for a source that exists, 404 otherwise told an attacker
    # which sources to aim an event wait at.
    body = to_body(pr_payload())
    inactive = make_source("gh-off", "github", is_active=False)
    make_route(inactive, "*", "github.prs")
    Source.objects.create(slug="pulled", provider="stream", secret="unused")
    answers = {
        "unknown, validly signed for another source": _refusal(post_webhook("no-such", body, github_headers(body))),
        "inactive, validly signed": _refusal(post_webhook("gh-off", body, github_headers(body))),
        "pull-only": _refusal(post_webhook("pulled", body, github_headers(body))),
        "active, wrong secret": _refusal(post_webhook("gh", body, github_headers(body, secret="guess"))),
        "active, no signature": _refusal(post_webhook("gh", body, {"X-GitHub-Event": "push"})),
        "active, malformed signature": _refusal(post_webhook("gh", body, {"X-Hub-Signature-256": "md5=1"})),
    }
    assert len(set(answers.values())) == 1, answers
    status, content = next(iter(answers.values()))
    assert status == 401 and b'"code": "unauthorized"' in content
    assert Event.objects.count() == 0 and Todo.objects.count() == 0


@pytest.mark.parametrize("timestamp", ["\u00b2", "9" * 5000, "\uff11\uff12\uff13", "-1", "1e9", ""])
def test_a_stripe_signature_with_a_timestamp_that_is_not_a_time_is_401_not_500(
    make_source, make_route, post_webhook, timestamp
):
    make_route(make_source("st", "stripe"), "*", "billing")
    body = to_body({"id": "evt_1", "type": "charge.succeeded"})
    response = post_webhook("st", body, {"Stripe-Signature": f"t={timestamp},v1=00"})
    assert response.status_code == 401
    assert Event.objects.count() == 0


@pytest.mark.parametrize("timestamp", ["\u00b2", "9" * 5000, "\uff11\uff12\uff13"])
def test_a_standard_webhooks_timestamp_that_is_not_a_time_is_401_not_500(
    make_source, make_route, post_webhook, timestamp
):
    make_route(make_source("std", "standard"), "*", "users")
    body = to_body({"type": "user.created"})
    headers = {**standard_headers(body), "webhook-timestamp": timestamp}
    response = post_webhook("std", body, headers)
    assert response.status_code == 401
    assert Event.objects.count() == 0


def test_a_well_formed_stripe_timestamp_still_verifies(make_source, make_route, post_webhook):
    make_route(make_source("st", "stripe"), "*", "billing")
    body = to_body({"id": "evt_2", "type": "charge.succeeded"})
    assert post_webhook("st", body, stripe_headers(body, timestamp=int(time.time()))).status_code == 202


# --- L3: an agent cannot pre-empt a webhook's todo by its idempotency key -------------------------


def test_an_agent_holding_the_old_route_key_does_not_swallow_the_delivery(github_source, post_webhook, make_agent):
    # The attack: a sequential delivery id is predictable, and the route's key was <delivery>:<route>.
    route = github_source.routes.get()
    squatter = Api(make_agent("squatter", claim=["github.*"], create=["github.*"]).token)
    squat = squatter.post(
        "/todos/", {"queue": "github.prs", "idempotency_key": f"1001:{route.id}", "payload": {"fake": True}}
    )
    assert squat.status_code == 201
    body = to_body(pr_payload(number=1001))
    response = post_webhook("gh", body, github_headers(body, delivery="1001"))
    assert response.status_code == 202
    [todo_id] = response.json()["todo_ids"]
    assert todo_id != squat.json()["id"]
    assert Todo.objects.get(pk=todo_id).payload == pr_payload(number=1001)


def test_a_replay_of_an_event_routed_before_the_prefix_finds_its_todo(github_source, post_webhook):
    # An event stored (and routed) under the old key shape, then the migration that prefixes the keys of
    # todos that can still run: a replay returns that todo rather than making a second one.
    body = to_body(pr_payload(number=5))
    response = post_webhook("gh", body, github_headers(body, delivery="old-5"))
    [todo_id] = response.json()["todo_ids"]
    route = github_source.routes.get()
    Todo.objects.filter(pk=todo_id).update(idempotency_key=f"old-5:{route.id}")
    migration = importlib.import_module("ingest.migrations.0006_route_todo_keys_prefixed")
    with connection.cursor() as cursor:
        cursor.execute(migration.PREFIX_ROUTE_KEYS)
    assert Todo.objects.get(pk=todo_id).idempotency_key == f"ingest:old-5:{route.id}"
    [again] = routing.replay(Event.objects.get(), agent=None)
    assert (again.created, again.todo.id) == (False, todo_id)


# --- L1: the admin's source preview (staff only, but a 500 all the same) ---------------------------


def test_the_source_previews_route_parameter_cannot_make_a_500(admin_client):
    source = Source.objects.create(slug="gh", provider="github", secret="s")
    for route in ("\u00b2", "9" * 5000, "12"):
        assert admin_client.get(f"/admin/ingest/source/{source.pk}/preview/", {"route": route}).status_code == 200


# --- L2: a captured delivery resent under a fresh delivery id --------------------------------------


def test_a_github_capture_resent_with_a_fresh_delivery_id_makes_nothing(github_source, post_webhook):
    body = to_body(pr_payload(number=77))
    first = post_webhook("gh", body, github_headers(body, delivery="real-1"))
    assert first.status_code == 202
    # The attacker has the body and its X-Hub-Signature-256 (a proxy log, the "Recent deliveries" page).
    replay = post_webhook("gh", body, github_headers(body, delivery="fresh-uuid"))
    retyped = post_webhook("gh", body, github_headers(body, event="deployment", delivery="fresh-uuid-2"))
    for answer in (replay, retyped):
        assert answer.status_code == 200
        assert answer.json() == {**first.json(), "duplicate": True}
    assert Event.objects.count() == 1 and Todo.objects.count() == 1


def test_a_github_retry_with_its_own_delivery_id_is_still_a_plain_redelivery(github_source, post_webhook):
    body = to_body(pr_payload(number=78))
    headers = github_headers(body, delivery="real-2")
    first = post_webhook("gh", body, headers)
    again = post_webhook("gh", body, headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == {**first.json(), "duplicate": True}


def test_the_same_github_body_after_the_window_is_a_new_event(github_source, post_webhook):
    body = to_body(pr_payload(number=79))
    assert post_webhook("gh", body, github_headers(body, delivery="old")).status_code == 202
    Event.objects.update(received_at=Now() - timedelta(days=31))
    assert post_webhook("gh", body, github_headers(body, delivery="new")).status_code == 202
    assert Event.objects.count() == 2


def test_the_same_body_from_another_source_or_provider_is_not_a_replay(
    github_source, make_source, make_route, post_webhook
):
    other = make_source("gh2", "github")
    make_route(other, "*", "github.prs")
    make_route(make_source("house", "hmac"), "*", "jobs")
    body = to_body(pr_payload(number=80))
    assert post_webhook("gh", body, github_headers(body)).status_code == 202
    assert post_webhook("gh2", body, github_headers(body)).status_code == 202
    # The house hmac provider does not dedupe bodies: its senders may post the same body twice on purpose.
    for _ in range(2):
        assert post_webhook("house", body, hmac_headers(body, event="tick")).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_concurrent_copies_of_a_github_body_under_fresh_ids_store_one_event(github_source):
    body = to_body(pr_payload(number=81))
    start = threading.Barrier(6)

    def send(n: int) -> int:
        try:
            start.wait()
            client = Client()
            headers = github_headers(body, delivery=f"copy-{n}")
            return client.post("/ingest/gh/", data=body, content_type="application/json", headers=headers).status_code
        finally:
            connections.close_all()

    with ThreadPoolExecutor(6) as pool:
        statuses = sorted(pool.map(send, range(6)))
    assert statuses == [200] * 5 + [202]
    assert Event.objects.count() == 1 and Todo.objects.count() == 1


def _timestamped_hmac(body: bytes, delivery: str, timestamp: int | str, secret: str = HMAC_SECRET) -> dict[str, str]:
    signed = f"{delivery}.{timestamp}.".encode() + body
    return {
        "X-Delivery-Id": delivery,
        "X-Signature-Timestamp": str(timestamp),
        "X-Signature-256": "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest(),
        "X-Event-Type": "build.finished",
    }


def test_a_timestamped_hmac_delivery_cannot_be_resent_under_another_id_later_or_downgraded(
    make_source, make_route, post_webhook
):
    make_route(make_source("house", "hmac"), "*", "jobs")
    body = to_body({"build": 1})
    now = int(time.time())
    headers = _timestamped_hmac(body, "b-1", now)
    assert post_webhook("house", body, headers).status_code == 202
    assert post_webhook("house", body, headers).status_code == 200  # the sender's retry: a redelivery
    # Fresh id, same signature: the id is signed.
    assert post_webhook("house", body, {**headers, "X-Delivery-Id": "b-2"}).status_code == 401
    # The timestamp header dropped: the signature is not of the body alone.
    without_time = {k: v for k, v in headers.items() if k != "X-Signature-Timestamp"}
    assert post_webhook("house", body, {**without_time, "X-Delivery-Id": "b-3"}).status_code == 401
    # Signed properly but outside the 300 s tolerance, or with a time that is no time.
    assert post_webhook("house", body, _timestamped_hmac(body, "b-4", now - 301)).status_code == 401
    assert post_webhook("house", body, _timestamped_hmac(body, "b-5", "\u00b2")).status_code == 401
    assert Event.objects.count() == 1


# --- L1: bytes PostgreSQL refuses, from anyone on the network --------------------------------------


def test_a_slug_with_a_nul_byte_answers_as_any_unknown_slug(github_source, post_webhook):
    body = to_body(pr_payload())
    unknown = post_webhook("no-such", body, github_headers(body))
    for slug in ("gh%00", "a%00b", "%C2%B2"):
        response = post_webhook(slug, body, github_headers(body))
        assert (response.status_code, response.content) == (unknown.status_code, unknown.content)
    assert Event.objects.count() == 0


def test_a_signed_delivery_whose_ids_or_headers_hold_a_nul_is_400_not_503(make_source, make_route, post_webhook):
    # 503 would have the sender retry for days a delivery that can never be stored.
    make_route(make_source("house", "hmac"), "*", "jobs")
    body = to_body({"type": "build.finished"})
    for headers in (
        hmac_headers(body, delivery="d\x00"),
        hmac_headers(body, event="build\x00"),
    ):
        assert post_webhook("house", body, headers).status_code == 400
    kept = {**hmac_headers(body, delivery="d-ok"), "User-Agent": "agent\x00x"}
    assert post_webhook("house", body, kept).status_code == 202
    assert "\x00" not in Event.objects.get().headers["User-Agent"]


@pytest.mark.parametrize(
    "fields", [{b"type": b"a\x00", b"payload": b"{}"}, {b"type": b"a", b"delivery_id": b"\x00", b"payload": b"{}"}]
)
def test_a_stream_entry_whose_ids_hold_a_nul_is_rejected_not_left_pending(fields):
    with pytest.raises(InvalidDelivery, match="NUL"):
        streams.parse_entry("orders", "1-0", fields, max_bytes=1000)
