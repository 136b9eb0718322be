"""POST /ingest/<slug>/ with real signed requests: what is accepted, what is refused, and that a refusal
stores nothing."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
import standardwebhooks
import stripe
from django.db.models.functions import Now

from events.models import Event
from ingest.tests.conftest import (
    GITHUB_SECRET,
    STANDARD_SECRET,
    STRIPE_SECRET,
    github_headers,
    hmac_headers,
    pr_payload,
    standard_headers,
    stripe_headers,
    to_body,
)
from todos.models import Todo, TodoState


def assert_nothing_stored():
    assert Event.objects.count() == 0
    assert Todo.objects.count() == 0


def test_receive_github_pull_request_stores_the_event_and_its_todo(github_source, post_webhook):
    body = to_body(pr_payload(number=12))
    response = post_webhook("gh", body, github_headers(body, delivery="del-1"))
    assert response.status_code == 202
    data = response.json()
    assert data["duplicate"] is False
    event = Event.objects.get()
    assert data["event_id"] == event.id and event.id.startswith("ev_")
    assert (event.source, event.type, event.delivery_id) == ("gh", "pull_request.opened", "del-1")
    assert event.payload == pr_payload(number=12)
    assert event.headers["X-GitHub-Event"] == "pull_request"
    assert not any("signature" in name.lower() for name in event.headers)
    [todo] = Todo.objects.all()
    assert data["todo_ids"] == [todo.id]
    route = github_source.routes.get()
    assert (todo.queue, todo.kind, todo.state, todo.source) == ("github.prs", "review", TodoState.PENDING, "gh")
    assert todo.title == "octo/hello#12: Add a feature"
    assert todo.idempotency_key == f"ingest:del-1:{route.id}"
    assert todo.event_id == event.id
    assert todo.payload == event.payload


def test_receive_github_ping_is_accepted_and_stored_without_todos(github_source, post_webhook):
    body = to_body({"zen": "Design for failure.", "hook_id": 1})
    response = post_webhook("gh", body, github_headers(body, event="ping"))
    assert response.status_code == 202
    assert response.json()["todo_ids"] == []
    assert Event.objects.get().type == "ping"
    assert Todo.objects.count() == 0


def test_receive_githubs_documented_vector_passes_the_signature_and_fails_as_json(make_source, post_webhook):
    # "Hello, World!" signed with "It's a Secret to Everybody" is authentic but not JSON: 400, not 401.
    make_source("vector", "github", secret="It's a Secret to Everybody")
    headers = {
        "X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "d",
    }
    response = post_webhook("vector", b"Hello, World!", headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert_nothing_stored()


def test_receive_github_form_encoded_delivery_is_accepted(github_source, post_webhook):
    body = urlencode({"payload": json.dumps(pr_payload(number=3))}).encode()
    response = post_webhook("gh", body, github_headers(body), content_type="application/x-www-form-urlencoded")
    assert response.status_code == 202
    assert Event.objects.get().payload["number"] == 3


def test_receive_stripe_event_is_accepted(make_source, make_route, post_webhook):
    source = make_source("billing", "stripe")
    make_route(source, "invoice.*", "billing.invoices", title_template="{data.object.id}")
    text = json.dumps({"id": "evt_123", "object": "event", "type": "invoice.paid", "data": {"object": {"id": "in_9"}}})
    # Signed by Stripe's own library, as Stripe signs.
    header = stripe.WebhookSignature.generate_signature_header(text, STRIPE_SECRET)
    response = post_webhook("billing", text.encode(), {"Stripe-Signature": header})
    assert response.status_code == 202
    event = Event.objects.get()
    assert (event.delivery_id, event.type) == ("evt_123", "invoice.paid")
    assert Todo.objects.get().title == "in_9"


def test_receive_standard_webhook_is_accepted(make_source, make_route, post_webhook):
    source = make_source("std", "standard")
    make_route(source, "user.*", "users")
    text = json.dumps({"type": "user.created", "data": {"id": "u1"}})
    now = datetime.now(tz=UTC)
    # Signed by the Standard Webhooks reference library.
    signature = standardwebhooks.Webhook(STANDARD_SECRET).sign("msg_abc", now, text)
    headers = {"webhook-id": "msg_abc", "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    response = post_webhook("std", text.encode(), headers)
    assert response.status_code == 202
    event = Event.objects.get()
    assert (event.delivery_id, event.type) == ("msg_abc", "user.created")
    assert event.headers["webhook-id"] == "msg_abc"
    assert "webhook-signature" not in event.headers
    assert Todo.objects.get().queue == "users"


def test_receive_hmac_delivery_is_accepted(make_source, make_route, post_webhook):
    source = make_source("ci", "hmac")
    make_route(source, "build.*", "ci.builds")
    body = to_body({"type": "build.failed"})
    response = post_webhook("ci", body, hmac_headers(body, delivery="b-77"))
    assert response.status_code == 202
    assert Event.objects.get().type == "build.failed"
    assert Todo.objects.get().idempotency_key.startswith("ingest:b-77:")


def test_receive_fans_out_to_every_matching_route(github_source, make_route, post_webhook):
    second = make_route(github_source, "pull_request.opened", "triage", title_template="{pull_request.user.login}")
    make_route(github_source, "issues.*", "issues")  # does not match
    make_route(github_source, "pull_request.*", "off", is_active=False)  # inactive
    body = to_body(pr_payload())
    response = post_webhook("gh", body, github_headers(body, delivery="fan"))
    assert response.status_code == 202
    todos = {t.queue: t for t in Todo.objects.all()}
    assert set(todos) == {"github.prs", "triage"}
    assert sorted(response.json()["todo_ids"]) == sorted(t.id for t in todos.values())
    assert todos["triage"].title == "mona"
    assert todos["triage"].idempotency_key == f"ingest:fan:{second.id}"


def test_receive_route_assignee_and_max_attempts_reach_the_todo(make_source, make_route, post_webhook):
    source = make_source()
    make_route(source, "push", "deploys", assignee="deployer", max_attempts=2)
    body = to_body({"ref": "refs/heads/main"})
    assert post_webhook("gh", body, github_headers(body, event="push")).status_code == 202
    todo = Todo.objects.get()
    assert (todo.assignee, todo.max_attempts) == ("deployer", 2)


def test_receive_redelivery_is_200_duplicate_and_creates_nothing(github_source, post_webhook):
    body = to_body(pr_payload())
    headers = github_headers(body, delivery="same")
    first = post_webhook("gh", body, headers).json()
    # Even after the todo is done (its key freed), a redelivery makes nothing new.
    Todo.objects.update(state=TodoState.DONE, completed_at=Now())
    again = post_webhook("gh", body, headers)
    assert again.status_code == 200
    assert again.json() == {"event_id": first["event_id"], "todo_ids": first["todo_ids"], "duplicate": True}
    assert Event.objects.count() == 1
    assert Todo.objects.count() == 1


def test_receive_accepts_the_previous_secret_during_rotation(make_source, make_route, post_webhook):
    make_source(secret="new-secret", previous_secret=GITHUB_SECRET)
    old, new = to_body(pr_payload(number=1)), to_body(pr_payload(number=2))  # one body twice is a replay
    assert post_webhook("gh", old, github_headers(old, secret=GITHUB_SECRET)).status_code == 202
    assert post_webhook("gh", new, github_headers(new, secret="new-secret")).status_code == 202
    assert post_webhook("gh", new, github_headers(new, secret="retired")).status_code == 401
    assert Event.objects.count() == 2


def test_receive_without_the_trailing_slash_is_accepted(github_source, client):
    body = to_body(pr_payload())
    response = client.post("/ingest/gh", data=body, content_type="application/json", headers=github_headers(body))
    assert response.status_code == 202


# --- refusals: each answers its status and stores nothing ----------------------------------------


def _tampered(body, headers):
    return body.replace(b"opened", b"closed"), headers


def _wrong_secret(body, headers):
    return body, github_headers(body, secret="not-the-secret")


def _missing_signature(body, headers):
    return body, {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}


@pytest.mark.parametrize("spoil", [_tampered, _wrong_secret, _missing_signature])
def test_receive_with_a_bad_github_signature_is_401_and_stores_nothing(github_source, post_webhook, spoil):
    body = to_body(pr_payload())
    body, headers = spoil(body, github_headers(body))
    response = post_webhook("gh", body, headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert_nothing_stored()


def test_receive_stripe_with_a_stale_timestamp_is_401_and_stores_nothing(make_source, make_route, post_webhook, caplog):
    make_route(make_source("billing", "stripe"), "*", "billing")
    body = to_body({"id": "evt_old", "type": "invoice.paid"})
    with caplog.at_level(logging.WARNING, logger="ingest"):
        response = post_webhook("billing", body, stripe_headers(body, timestamp=int(time.time()) - 600))
    assert response.status_code == 401
    # The reason is the operator's (the log), never the sender's: the body is the one refusal.
    assert "tolerance" in caplog.text and "tolerance" not in response.json()["error"]["detail"]
    assert_nothing_stored()


def test_receive_standard_with_a_stale_timestamp_is_401_and_stores_nothing(make_source, make_route, post_webhook):
    make_route(make_source("std", "standard"), "*", "users")
    body = to_body({"type": "user.created"})
    response = post_webhook("std", body, standard_headers(body, timestamp=int(time.time()) + 600))
    assert response.status_code == 401
    assert_nothing_stored()


def test_receive_for_an_unknown_slug_is_401_and_stores_nothing(github_source, post_webhook):
    body = to_body(pr_payload())
    response = post_webhook("nope", body, github_headers(body))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert_nothing_stored()


def test_receive_for_an_inactive_source_is_401_and_stores_nothing(github_source, post_webhook):
    github_source.is_active = False
    github_source.save()
    body = to_body(pr_payload())
    assert post_webhook("gh", body, github_headers(body)).status_code == 401
    assert_nothing_stored()


def test_receive_an_oversized_body_is_413_and_stores_nothing(github_source, post_webhook, settings):
    settings.INGEST_MAX_BODY_BYTES = 1000
    body = to_body({**pr_payload(), "padding": "x" * 1000})
    response = post_webhook("gh", body, github_headers(body))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert_nothing_stored()


def test_receive_a_body_exactly_at_the_limit_is_accepted(github_source, post_webhook, settings):
    body = to_body(pr_payload())
    settings.INGEST_MAX_BODY_BYTES = len(body)
    assert post_webhook("gh", body, github_headers(body)).status_code == 202


def test_receive_reads_at_most_the_limit_when_content_length_understates_it(github_source, rf, settings):
    from ingest.views import receive

    settings.INGEST_MAX_BODY_BYTES = 100
    body = to_body({**pr_payload(), "padding": "x" * 500})
    request = rf.post("/ingest/gh/", data=body, content_type="application/json", headers=github_headers(body))
    request.META.pop("CONTENT_LENGTH")  # a server that passes the stream without a length
    request._stream.limit = len(body)  # the stream itself still holds the whole body
    response = receive(request, "gh")
    assert response.status_code == 413
    assert_nothing_stored()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[1, 2, 3]",  # JSON, but not an object
        b'{"a": NaN}',
        b'{"a": "\\u0000"}',  # valid JSON that jsonb cannot store
        b'{"a": "\\ud800"}',  # an unpaired surrogate
        b"\xff\xfe{}",
        b"[" * 100_000,  # nesting deep enough to exhaust the parser's recursion
    ],
)
def test_receive_an_authentic_body_that_is_not_a_json_object_is_400_and_stores_nothing(
    github_source, post_webhook, body
):
    response = post_webhook("gh", body, github_headers(body))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert_nothing_stored()


def test_receive_github_without_a_delivery_id_is_400_and_stores_nothing(github_source, post_webhook):
    body = to_body(pr_payload())
    headers = github_headers(body)
    del headers["X-GitHub-Delivery"]
    response = post_webhook("gh", body, headers)
    assert response.status_code == 400
    assert "X-GitHub-Delivery" in response.json()["error"]["detail"]
    assert_nothing_stored()


def test_receive_with_get_is_405(github_source, client):
    response = client.get("/ingest/gh/")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_receive_a_route_to_an_unusable_queue_is_503_and_stores_nothing(github_source, make_route, post_webhook):
    # Saved around validation (as a bad migration or a shell session might): the delivery is fine, the
    # configuration is not; the provider is told to retry later and nothing is half-stored.
    make_route(github_source, "pull_request.*", "not a queue!")
    body = to_body(pr_payload())
    response = post_webhook("gh", body, github_headers(body))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"
    assert_nothing_stored()


def test_receive_logs_outcomes_without_body_or_secret(github_source, post_webhook, caplog):
    body = to_body({**pr_payload(), "marker": "body-content-marker"})
    with caplog.at_level(logging.INFO, logger="ingest"):
        post_webhook("gh", body, github_headers(body, delivery="log-1"))
        post_webhook("gh", body, github_headers(body, delivery="log-1"))
        post_webhook("gh", body, github_headers(body, secret="wrong"))
    text = caplog.text
    assert "ingest accepted" in text and "ingest duplicate" in text and "reason=unauthorized" in text
    assert "body-content-marker" not in text
    assert GITHUB_SECRET not in text
