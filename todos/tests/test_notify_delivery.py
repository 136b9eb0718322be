"""The notify sidecar end to end (issue 29): deliveries enqueued by todos/notices.py, sent by
``manage.py notify --once`` to a real HTTP receiver (each webhook verified with the standardwebhooks
library) and a real SMTP server (aiosmtpd) through Django's SMTP backend; a receiver that is down is retried
with backoff, then dead-lettered and shown in the admin."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.urls import reverse
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from todos.models import NotifyEndpoint, Todo, TodoState
from todos.notices import NOTIFY_QUEUE, Notice, notify_url, notify_users
from todos.outbound import sign

NOTICE = Notice(
    key="wait:td_9:asked",
    event="wait.asked",
    subject="Merge PR #7?",
    text="The agent asks: merge <b>PR #7</b>?",
    links={
        "approve": "https://sb.example/d/abc/approve",
        "open": "https://sb.example/inbox/td_9/",
        "x": "javascript:alert(1)",
    },
    data={"todo": "td_9"},
)


def run_notify() -> str:
    out = StringIO()
    call_command("notify", "--once", stdout=out)
    return out.getvalue()


def test_the_signer_matches_the_standard_webhooks_library():
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert sign(secret, "msg_1", 1_700_000_000, b'{"a":1}') == Webhook(secret).sign(
        "msg_1", _dt(1_700_000_000), '{"a":1}'
    )


def _dt(ts: int):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC)


def test_a_webhook_reaches_the_endpoint_signed_with_its_secret(db, receiver):
    ann = User.objects.create_user("ann")
    endpoint = NotifyEndpoint.objects.create(user=ann, url=receiver.url + "/slack-bridge")
    [delivery] = notify_users(users=[ann], notice=NOTICE)
    assert run_notify() == "sent=1 failed=0\n"
    [request] = receiver.requests
    assert request.path == "/slack-bridge"
    body = Webhook(endpoint.secret).verify(request.body, request.headers)  # raises if the signature is wrong
    assert request.headers["webhook-id"] == delivery
    assert body["type"] == "wait.asked"
    assert body["data"]["subject"] == "Merge PR #7?" and body["data"]["todo"] == "td_9"
    assert body["data"]["links"]["approve"] == "https://sb.example/d/abc/approve"
    todo = Todo.objects.get(id=delivery)
    assert todo.state == TodoState.DONE and todo.result["status"] == 204
    with pytest.raises(WebhookVerificationError):  # another secret does not verify it
        Webhook("whsec_" + "A" * 43 + "=").verify(request.body, request.headers)


def test_an_email_reaches_the_smtp_server_with_its_links_as_buttons(db, smtp, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = smtp.host, smtp.port
    ann = User.objects.create_user("ann", email="ann@example.com")
    reviewers = Group.objects.create(name="reviewers")
    bob = User.objects.create_user("bob", email="bob@example.com")
    bob.groups.add(reviewers)
    notify_users(users=[ann], groups=[reviewers], notice=NOTICE)
    assert run_notify() == "sent=2 failed=0\n"
    assert sorted(m["To"] for m in smtp.messages) == ["ann@example.com", "bob@example.com"]
    message = smtp.messages[0]
    assert message["Subject"] == "Merge PR #7?"
    parts = {p.get_content_type(): p.get_payload(decode=True).decode() for p in message.walk() if not p.is_multipart()}
    assert "approve: https://sb.example/d/abc/approve" in parts["text/plain"]
    html = parts["text/html"]
    assert '<a href="https://sb.example/d/abc/approve"' in html and ">Approve</a>" in html
    assert "&lt;b&gt;PR #7&lt;/b&gt;" in html and "<b>" not in html  # the text is escaped
    assert "javascript:" not in html and "javascript:" not in parts["text/plain"]


def test_a_receiver_that_is_down_is_retried_with_backoff_then_dead_lettered(db, receiver, settings, admin_client):
    settings.NOTIFY_MAX_ATTEMPTS = 2
    settings.QUEUE_RETRY_BASE_SECONDS = 3600  # full jitter over an hour: not due again within this test
    down = receiver.url.rsplit(":", 1)[0] + ":9"  # nothing listens on the discard port
    todo_id = notify_url(url=down + "/cb", secret="whsec_c2VjcmV0", notice=NOTICE)
    assert run_notify() == "sent=0 failed=1\n"
    todo = Todo.objects.get(id=todo_id)
    assert todo.state == TodoState.FAILED and todo.next_retry_at is not None  # backoff: a retry is due later
    assert "could not connect" in todo.errors[-1]["error"]
    assert run_notify() == "sent=0 failed=0\n"  # not before its backoff is over
    Todo.objects.filter(id=todo_id).update(next_retry_at="2000-01-01T00:00:00Z")
    assert run_notify() == "sent=0 failed=1\n"
    todo.refresh_from_db()
    assert todo.is_dead_letter and todo.attempt == 2
    page = admin_client.ok(reverse("admin:todos_todo_changelist"), {"dead": "yes", "queue": NOTIFY_QUEUE})
    assert todo_id in page.content.decode()


def test_a_non_2xx_answer_is_a_failure_naming_the_status(db, receiver):
    receiver.status = 500
    todo_id = notify_url(url=receiver.url + "/cb", secret="whsec_c2VjcmV0", notice=NOTICE)
    assert run_notify() == "sent=0 failed=1\n"
    assert Todo.objects.get(id=todo_id).errors[-1]["error"].startswith("HTTP 500 from 127.0.0.1")


def test_a_deactivated_endpoint_sends_nothing(db, receiver):
    ann = User.objects.create_user("ann")
    endpoint = NotifyEndpoint.objects.create(user=ann, url=receiver.url)
    notify_users(users=[ann], notice=NOTICE)
    NotifyEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
    assert run_notify() == "sent=0 failed=1\n"
    assert receiver.requests == []


def test_the_body_is_json_of_the_notice(db, receiver):
    todo_id = notify_url(url=receiver.url, secret="whsec_c2VjcmV0", notice=NOTICE)
    run_notify()
    body = json.loads(receiver.requests[0].body)
    assert body["type"] == "wait.asked" and receiver.requests[0].headers["webhook-id"] == todo_id


def test_a_drain_tries_a_delivery_once_even_when_its_retry_is_due_at_once(db, settings):
    settings.QUEUE_RETRY_BASE_SECONDS = 0.000001  # the jittered backoff comes out as good as zero
    todo_id = notify_url(url="http://127.0.0.1:9/cb", secret="whsec_c2VjcmV0", notice=NOTICE)
    assert run_notify() == "sent=0 failed=1\n"  # it ends, having tried the delivery once
    assert Todo.objects.get(id=todo_id).attempt == 1  # given back (pending) if its retry was due at once
    Todo.objects.filter(id=todo_id, state=TodoState.FAILED).update(next_retry_at="2000-01-01T00:00:00Z")
    assert run_notify() == "sent=0 failed=1\n"
    assert Todo.objects.get(id=todo_id).attempt == 2
