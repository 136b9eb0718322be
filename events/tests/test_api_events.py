"""GET /api/v1/events/, GET /api/v1/events/<id>/, POST /api/v1/events/<id>/replay/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db.models.functions import Now

from events.models import Event
from ingest import routing
from ingest.models import Route, Source
from todos.models import Todo, TodoState


@pytest.fixture
def world(db):
    """Two sources: github routes into github.* queues, billing into billing; "quiet" has no routes."""
    gh = Source.objects.create(slug="gh", provider="github", secret="s")
    billing = Source.objects.create(slug="billing", provider="stripe", secret="whsec_x")
    Source.objects.create(slug="quiet", provider="hmac", secret="s")
    Route.objects.create(source=gh, event_pattern="pull_request.*", queue="github.prs")
    Route.objects.create(source=gh, event_pattern="*", queue="audit")
    Route.objects.create(source=billing, event_pattern="*", queue="billing")
    events = {
        "pr": Event.objects.create(source="gh", type="pull_request.opened", delivery_id="1", payload={"n": 1}),
        "push": Event.objects.create(source="gh", type="push", delivery_id="2", payload={"n": 2}),
        "invoice": Event.objects.create(source="billing", type="invoice.paid", delivery_id="evt_1", payload={}),
        "quiet": Event.objects.create(source="quiet", type="x", delivery_id="q", payload={}),
    }
    for event in events.values():
        with_routes = routing.active_routes(event.source)
        routing.route_event(event, with_routes)
    return events


def bearer(agent):
    return {"Authorization": f"Bearer {agent.token}"}


def test_list_events_shows_an_agent_only_sources_routed_into_its_scopes(client, world, make_agent):
    agent = make_agent("gh-bot", claim=["github.*"], create=[])
    response = client.get("/api/v1/events/", headers=bearer(agent))
    assert response.status_code == 200
    ids = [row["id"] for row in response.json()["results"]]
    assert sorted(ids) == sorted([world["pr"].id, world["push"].id])
    assert "payload" not in response.json()["results"][0]


def test_list_events_through_create_scopes_counts_too(client, world, make_agent):
    agent = make_agent("biller", claim=[], create=["billing"])
    ids = [row["id"] for row in client.get("/api/v1/events/", headers=bearer(agent)).json()["results"]]
    assert ids == [world["invoice"].id]


def test_list_events_shows_staff_every_event(client, world):
    staff = get_user_model().objects.create_user("op", password=None, is_staff=True, is_superuser=True)
    client.force_login(staff)
    ids = {row["id"] for row in client.get("/api/v1/events/").json()["results"]}
    assert ids == {e.id for e in world.values()}


def test_list_events_without_credentials_is_401(client, world):
    response = client.get("/api/v1/events/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_list_events_filters_by_source_and_type(client, world, make_agent):
    agent = make_agent("all")
    by_source = client.get("/api/v1/events/?source=billing", headers=bearer(agent)).json()["results"]
    assert [row["id"] for row in by_source] == [world["invoice"].id]
    by_type = client.get("/api/v1/events/?type=push", headers=bearer(agent)).json()["results"]
    assert [row["id"] for row in by_type] == [world["push"].id]


def test_list_events_pages_newest_first_with_a_cursor(client, world, make_agent):
    agent = make_agent("all")
    for age, key in enumerate(["pr", "push", "invoice"]):
        Event.objects.filter(pk=world[key].pk).update(received_at=Now() - timedelta(minutes=age))
    page = client.get("/api/v1/events/?page_size=2", headers=bearer(agent)).json()
    assert [row["id"] for row in page["results"]] == [world["pr"].id, world["push"].id]
    rest = client.get(page["next"], headers=bearer(agent)).json()
    assert [row["id"] for row in rest["results"]] == [world["invoice"].id]
    assert rest["next"] is None


def test_get_event_shows_payload_and_only_visible_todos(client, world, make_agent):
    agent = make_agent("gh-bot", claim=["github.*"], create=[])
    response = client.get(f"/api/v1/events/{world['pr'].id}/", headers=bearer(agent))
    assert response.status_code == 200
    data = response.json()
    assert data["payload"] == {"n": 1}
    # The event made todos in github.prs and audit; the agent sees only its own queue's.
    assert [t["queue"] for t in data["todos"]] == ["github.prs"]
    assert Todo.objects.filter(event=world["pr"]).count() == 2


def test_get_event_out_of_scope_is_404(client, world, make_agent):
    agent = make_agent("gh-bot", claim=["github.*"], create=[])
    response = client.get(f"/api/v1/events/{world['invoice'].id}/", headers=bearer(agent))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert client.get("/api/v1/events/ev_nope/", headers=bearer(agent)).status_code == 404


def test_replay_event_returns_runnable_todos_and_creates_nothing(client, world, make_agent):
    agent = make_agent("all")
    before = set(Todo.objects.values_list("id", flat=True))
    response = client.post(f"/api/v1/events/{world['pr'].id}/replay/", headers=bearer(agent))
    assert response.status_code == 200
    data = response.json()
    assert data["created_todo_ids"] == []
    assert set(data["todo_ids"]) == set(Todo.objects.filter(event=world["pr"]).values_list("id", flat=True))
    assert set(Todo.objects.values_list("id", flat=True)) == before


def test_replay_event_gives_a_done_todo_a_fresh_one(client, world, make_agent):
    agent = make_agent("all")
    done = Todo.objects.get(event=world["pr"], queue="github.prs")
    Todo.objects.filter(pk=done.pk).update(state=TodoState.DONE, completed_at=Now())
    data = client.post(f"/api/v1/events/{world['pr'].id}/replay/", headers=bearer(agent)).json()
    [fresh_id] = data["created_todo_ids"]
    fresh = Todo.objects.get(pk=fresh_id)
    assert (fresh.queue, fresh.state, fresh.event_id) == ("github.prs", TodoState.PENDING, world["pr"].id)
    done.refresh_from_db()
    assert done.state == TodoState.DONE


def test_replay_event_by_an_agent_creates_only_in_its_create_scopes(client, world, make_agent):
    agent = make_agent("gh-bot", claim=["github.*"], create=["github.*"])
    Todo.objects.filter(event=world["pr"]).update(state=TodoState.DONE, completed_at=Now())
    data = client.post(f"/api/v1/events/{world['pr'].id}/replay/", headers=bearer(agent)).json()
    assert [Todo.objects.get(pk=i).queue for i in data["created_todo_ids"]] == ["github.prs"]


def test_replay_event_out_of_scope_is_404_and_creates_nothing(client, world, make_agent):
    agent = make_agent("gh-bot", claim=["github.*"], create=["github.*"])
    count = Todo.objects.count()
    response = client.post(f"/api/v1/events/{world['invoice'].id}/replay/", headers=bearer(agent))
    assert response.status_code == 404
    assert Todo.objects.count() == count


def test_list_events_with_a_nul_in_a_filter_is_400(client, world, make_agent):
    agent = make_agent("all")
    response = client.get("/api/v1/events/?source=a%00b", headers=bearer(agent))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


@pytest.mark.parametrize("pk", ["ev%00x", "x" * 41, "ev_%20"])
def test_get_and_replay_an_impossible_event_id_is_404(client, world, make_agent, pk):
    agent = make_agent("all")
    assert client.get(f"/api/v1/events/{pk}/", headers=bearer(agent)).status_code == 404
    assert client.post(f"/api/v1/events/{pk}/replay/", headers=bearer(agent)).status_code == 404
