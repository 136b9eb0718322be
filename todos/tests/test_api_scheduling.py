"""Scheduling through HTTP (issue 12): run_at, delay_seconds and priority on create, the scheduled state in
listings, staff's PATCH priority and run-now, GET /api/v1/schedules/, and each refusal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from todos.models import Schedule, Todo, TodoState
from todos.tests.conftest import V1


@pytest.fixture
def staff(django_user_model) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_user("root", is_staff=True, is_superuser=True))
    return client


def _patch(client: Client, path: str, body: object):
    return client.patch(V1 + path, data=json.dumps(body), content_type="application/json")


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_create_with_run_at_answers_a_scheduled_todo_showing_run_at_and_priority(api):
    at = datetime.now(UTC) + timedelta(hours=2)
    response = api.post("/todos/", {"queue": "q", "run_at": _iso(at), "priority": -5})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "scheduled" and body["priority"] == -5
    assert datetime.fromisoformat(body["run_at"]) == at.replace(microsecond=at.microsecond)


def test_create_with_a_delay_is_scheduled(api):
    body = api.post("/todos/", {"queue": "q", "delay_seconds": 30}).json()
    assert body["state"] == "scheduled"
    assert datetime.fromisoformat(body["run_at"]) > datetime.fromisoformat(body["created_at"])


def test_every_todo_shows_run_at_its_creation_time_when_not_scheduled(api):
    body = api.post("/todos/", {"queue": "q"}).json()
    assert body["state"] == "pending" and body["run_at"] == body["created_at"] and body["priority"] == 0


def test_a_duplicate_create_returns_the_scheduled_todo(api):
    first = api.post("/todos/", {"queue": "q", "idempotency_key": "k", "delay_seconds": 600}).json()
    again = api.post("/todos/", {"queue": "q", "idempotency_key": "k"})
    assert again.status_code == 200
    assert again.json()["id"] == first["id"] and again.json()["state"] == "scheduled"


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"run_at": "tomorrow"}, {"run_at"}),
        ({"run_at": "2030-01-01T00:00:00"}, {"run_at"}),  # no offset
        ({"run_at": "2030-01-01"}, {"run_at"}),
        ({"run_at": "2030-13-01T00:00:00Z"}, {"run_at"}),
        ({"run_at": "2999-01-01T00:00:00Z"}, {"run_at"}),  # beyond a year
        ({"run_at": 1767225600}, {"run_at"}),
        ({"delay_seconds": -1}, {"delay_seconds"}),
        ({"delay_seconds": 31_536_001}, {"delay_seconds"}),
        ({"delay_seconds": "soon"}, {"delay_seconds"}),
        ({"run_at": "SOON", "delay_seconds": 5}, {"run_at", "delay_seconds"}),
        ({"priority": 101}, {"priority"}),
        ({"priority": -101}, {"priority"}),
        ({"priority": 1.5}, {"priority"}),
        ({"priority": "1"}, {"priority"}),
        ({"priority": True}, {"priority"}),
    ],
)
def test_bad_scheduling_input_is_refused_naming_the_field_and_stores_nothing(api, body, fields):
    if body.get("run_at") == "SOON":
        body = {**body, "run_at": _iso(datetime.now(UTC) + timedelta(days=1))}
    response = api.post("/todos/", {"queue": "q", **body})
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid" and set(error["fields"]) == fields
    assert not Todo.objects.exists()


def test_the_list_filters_scheduled_todos_and_queues_count_them(api, make_todo):
    scheduled = make_todo("q", delay_seconds=600)
    make_todo("q")
    listed = api.get("/todos/", state="scheduled").json()["results"]
    assert [t["id"] for t in listed] == [scheduled.id]
    [stats] = api.get("/queues/").json()["queues"]
    assert (stats["pending"], stats["scheduled"]) == (1, 1)


def test_staff_change_the_priority_of_a_pending_todo(staff, make_todo):
    todo = make_todo("q")
    response = _patch(staff, f"/todos/{todo.id}/", {"priority": -20})
    assert response.status_code == 200, response.json()
    assert response.json()["priority"] == -20 and Todo.objects.get(pk=todo.pk).priority == -20


def test_patch_priority_of_a_claimed_todo_is_a_conflict_with_its_state(staff, agent, make_todo):
    from todos import queue

    make_todo("q")
    [claimed] = queue.claim_next(agent=agent)
    response = _patch(staff, f"/todos/{claimed.id}/", {"priority": 3})
    assert response.status_code == 409 and response.json()["error"]["state"] == "claimed"


@pytest.mark.parametrize("body", [{"priority": 200}, {"priority": "x"}, {}])
def test_patch_with_a_bad_priority_is_refused_naming_it(staff, make_todo, body):
    todo = make_todo("q")
    response = _patch(staff, f"/todos/{todo.id}/", body)
    assert response.status_code == 400 and "priority" in response.json()["error"]["fields"]
    assert Todo.objects.get(pk=todo.pk).priority == 0


def test_an_agent_may_not_patch_priority_nor_learn_of_todos_outside_its_scopes(make_agent, api_for, make_todo):
    mine, theirs = make_todo("a"), make_todo("b")
    client = api_for(make_agent("narrow", claim=["a"])).client
    assert _patch(client, f"/todos/{mine.id}/", {"priority": 1}).status_code == 403
    assert _patch(client, f"/todos/{theirs.id}/", {"priority": 1}).status_code == 404
    assert set(Todo.objects.values_list("priority", flat=True)) == {0}


def test_staff_run_a_scheduled_todo_now(staff, make_todo):
    todo = make_todo("q", delay_seconds=3600)
    response = staff.post(f"{V1}/todos/{todo.id}/run-now/")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "pending"
    assert response.json()["errors"][-1]["operator"] == "staff:root"


def test_run_now_of_a_pending_todo_is_a_conflict_and_agents_are_refused(staff, api, make_todo):
    pending, scheduled = make_todo("q"), make_todo("q", delay_seconds=60)
    assert staff.post(f"{V1}/todos/{pending.id}/run-now/").status_code == 409
    assert api.post(f"/todos/{scheduled.id}/run-now/").status_code == 403
    assert Todo.objects.get(pk=scheduled.pk).state == TodoState.SCHEDULED


def test_schedules_are_listed_to_staff_and_to_agents_whose_create_scopes_cover_the_queue(staff, make_agent, api_for):
    Schedule.objects.create(name="nightly", cron="30 2 * * *", timezone="Europe/Berlin", queue="reports")
    Schedule.objects.create(name="hourly", cron="0 * * * *", queue="ops.cleanup")
    assert [s["name"] for s in staff.get(f"{V1}/schedules/").json()["schedules"]] == ["hourly", "nightly"]
    reporter = api_for(make_agent("reporter", claim=["reports"], create=["reports"]))
    [seen] = reporter.get("/schedules/").json()["schedules"]
    assert seen["name"] == "nightly" and seen["timezone"] == "Europe/Berlin" and seen["active"] is True
    tick = datetime.fromisoformat(seen["next_run_at"])
    assert tick > datetime.now(UTC) and (tick.hour, tick.minute) in {(0, 30), (1, 30)}  # 02:30 Berlin in UTC
    claimer = api_for(make_agent("claimer", claim=["reports"], create=[]))
    assert claimer.get("/schedules/").json()["schedules"] == []
