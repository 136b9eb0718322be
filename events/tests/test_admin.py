"""The event admin: filters, pretty payload, its todos, and the replay action's guard."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.urls import reverse

from events import router as event_router
from events.models import Event
from todos import queue


@pytest.fixture
def events(db):
    return [
        Event.objects.create(source="gh", type="push", delivery_id="d1", payload={"ref": "main", "n": 1}),
        Event.objects.create(source="gh", type="pull_request.opened", delivery_id="d2"),
        Event.objects.create(source="stripe", type="charge.failed", delivery_id="d3"),
    ]


def test_event_list_filters_by_source_and_type(admin_client, events, django_assert_max_num_queries):
    url = reverse("admin:events_event_changelist")
    with django_assert_max_num_queries(6):
        body = admin_client.page(url, {"source": "gh", "type": "push"})
    assert events[0].id in body and events[1].id not in body and events[2].id not in body
    assert "?source=stripe" in body and "type=charge.failed" in body  # choices from the data


def test_event_search_is_exact(admin_client, events):
    url = reverse("admin:events_event_changelist")
    body = admin_client.page(url, {"q": "d2"})
    assert events[1].id in body and events[0].id not in body
    assert events[2].id in admin_client.page(url, {"q": events[2].id})


def test_event_detail_shows_payload_and_its_todos(admin_client, events):
    todo, _ = queue.create(queue="q", title="from the push", event_id=events[0].id)
    body = admin_client.page(reverse("admin:events_event_change", args=[quote(events[0].id)]))
    assert "&quot;ref&quot;: &quot;main&quot;" in body
    assert reverse("admin:todos_todo_change", args=[quote(todo.id)]) in body
    assert 'name="_save"' not in body


def test_replay_action_is_hidden_until_a_router_is_registered(admin_client, events, monkeypatch):
    url = reverse("admin:events_event_changelist")
    monkeypatch.setattr(event_router, "_router", None)
    assert b'value="replay"' not in admin_client.ok(url).content

    replayed = []

    class FakeRouter:  # stands in for ingest's router: no database is faked here
        def replay(self, event, *, agent=None):
            replayed.append(event.id)
            if event.delivery_id == "d3":
                raise RuntimeError("route 4 could not make its todo")
            return [SimpleNamespace(created=True), SimpleNamespace(created=False)]

    event_router.register(FakeRouter())
    assert b'value="replay"' in admin_client.ok(url).content
    response = admin_client.post(url, {"action": "replay", "_selected_action": [e.id for e in events]}, follow=True)
    assert sorted(replayed) == sorted(e.id for e in events)
    messages = [str(m) for m in response.context["messages"]]
    assert messages[0] == "2 event(s) replayed: 2 new todo(s), 2 already there (not duplicated)."
    assert messages[1] == f"Not replayed: {events[2].id}: route 4 could not make its todo"
    assert LogEntry.objects.filter(object_id=events[0].id, change_message__startswith="Replayed").exists()


def test_events_cannot_be_added_changed_or_deleted(admin_client, events):
    assert admin_client.get(reverse("admin:events_event_add")).status_code == 403
    response = admin_client.post(reverse("admin:events_event_delete", args=[quote(events[0].id)]), {"post": "yes"})
    assert response.status_code == 403
    assert Event.objects.filter(pk=events[0].id).exists()


def test_replay_action_runs_ingest_routing_without_duplicating(admin_client, events):
    from ingest.models import Route, Source

    source = Source.objects.create(slug="gh", provider="github", secret="s3cret-for-tests")
    Route.objects.create(source=source, event_pattern="push", queue="builds", kind="build", title_template="push")
    url = reverse("admin:events_event_changelist")
    first = admin_client.post(url, {"action": "replay", "_selected_action": [events[0].id]}, follow=True)
    assert [str(m) for m in first.context["messages"]] == [
        "1 event(s) replayed: 1 new todo(s), 0 already there (not duplicated)."
    ]
    second = admin_client.post(url, {"action": "replay", "_selected_action": [events[0].id]}, follow=True)
    assert [str(m) for m in second.context["messages"]] == [
        "1 event(s) replayed: 0 new todo(s), 1 already there (not duplicated)."
    ]
    assert events[0].todos.filter(queue="builds").count() == 1
