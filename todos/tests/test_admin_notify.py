"""The admin of notify endpoints (issue 29): the SSRF guard on save, the signing secret shown once on
creation and on rotation; an agent's webhook_secret readable by staff who manage agents."""

from __future__ import annotations

from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.urls import reverse

from todos.models import Agent, NotifyEndpoint


def test_adding_an_endpoint_shows_its_secret_once(admin_client, settings):
    ann = User.objects.create_user("ann")
    response = admin_client.post(
        reverse("admin:todos_notifyendpoint_add"),
        {"user": ann.pk, "url": "http://127.0.0.1:9/hook", "active": "on", "events": ""},
    )
    assert response.status_code == 200, response.content[:2000]
    endpoint = NotifyEndpoint.objects.get()
    assert endpoint.secret.startswith("whsec_") and endpoint.secret in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    page = admin_client.page(reverse("admin:todos_notifyendpoint_change", args=[endpoint.pk]))
    assert endpoint.secret not in page


def test_an_endpoint_to_a_private_address_is_refused_by_the_form(admin_client, settings):
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = False
    ann = User.objects.create_user("ann")
    response = admin_client.post(
        reverse("admin:todos_notifyendpoint_add"), {"user": ann.pk, "url": "http://169.254.169.254/", "active": "on"}
    )
    assert response.status_code == 200 and not NotifyEndpoint.objects.exists()
    assert "private, loopback, link-local or reserved" in response.content.decode()


def test_an_endpoint_needs_one_owner(admin_client):
    response = admin_client.post(
        reverse("admin:todos_notifyendpoint_add"), {"url": "http://127.0.0.1:9/", "active": "on"}
    )
    assert response.status_code == 200 and not NotifyEndpoint.objects.exists()


def test_rotating_shows_the_new_secret(admin_client):
    ann = User.objects.create_user("ann")
    endpoint = NotifyEndpoint.objects.create(user=ann, url="http://127.0.0.1:9/hook")
    old = endpoint.secret
    response = admin_client.post(
        reverse("admin:todos_notifyendpoint_changelist"), {"action": "rotate_secret", "_selected_action": [endpoint.pk]}
    )
    endpoint.refresh_from_db()
    assert endpoint.secret != old and endpoint.secret in response.content.decode()


def test_an_agent_added_in_the_admin_gets_a_webhook_secret_shown_on_its_page(admin_client):
    admin_client.post(
        reverse("admin:todos_agent_add"),
        {"name": "producer", "claim_scopes": "jobs", "create_scopes": "jobs", "is_active": "on"},
    )
    agent = Agent.objects.get(name="producer")
    assert agent.webhook_secret and agent.webhook_secret.startswith("whsec_")
    page = admin_client.page(reverse("admin:todos_agent_change", args=[agent.pk]))
    assert agent.webhook_secret in page


def test_a_deliverys_signing_secret_is_hidden_on_its_admin_page(admin_client):
    from todos.notices import Notice, notify_url

    delivery = notify_url(
        url="http://127.0.0.1:9/cb",
        secret="whsec_c2VjcmV0c2VjcmV0",
        notice=Notice(key="k", event="e", subject="s", text="t"),
    )
    page = admin_client.page(reverse("admin:todos_todo_change", args=[quote(delivery)]))
    assert "http://127.0.0.1:9/cb" in page and "whsec_c2VjcmV0c2VjcmV0" not in page


def test_pausing_the_notify_queue_in_the_admin_holds_every_notice(admin_client, receiver):
    from io import StringIO

    from django.core.management import call_command

    from todos.models import Queue
    from todos.notices import NOTIFY_QUEUE, Notice, notify_url

    notify_url(url=receiver.url, secret="whsec_c2VjcmV0", notice=Notice(key="k", event="e", subject="s", text="t"))
    changelist = reverse("admin:todos_queue_changelist")
    admin_client.post(changelist, {"action": "pause_queues", "_selected_action": [NOTIFY_QUEUE]})
    assert Queue.objects.get(name=NOTIFY_QUEUE).paused
    assert admin_client.get(reverse("admin:todos_queue_change", args=[NOTIFY_QUEUE])).status_code == 200
    out = StringIO()
    call_command("notify", "--once", stdout=out)
    assert out.getvalue() == "sent=0 failed=0\n" and receiver.requests == []
    admin_client.post(changelist, {"action": "resume_queues", "_selected_action": [NOTIFY_QUEUE]})
    out = StringIO()
    call_command("notify", "--once", stdout=out)
    assert out.getvalue() == "sent=1 failed=0\n" and len(receiver.requests) == 1
