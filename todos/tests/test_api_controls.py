"""The control endpoints over HTTP: cancel a todo, pause, resume and limit a queue (issue 11)."""

from __future__ import annotations

import json

import pytest

from todos import queue
from todos.models import Queue, Todo, TodoState

pytestmark = pytest.mark.django_db


@pytest.fixture
def manager(make_agent, api_for):
    return api_for(make_agent("ops", claim=["jobs*"], can_manage_queues=True))


def _patch(api, path, body):
    return api.client.patch("/api/v1" + path, data=json.dumps(body), content_type="application/json")


# --- cancel -------------------------------------------------------------------------------------


def test_cancel_a_pending_todo_makes_it_cancelled_and_records_who_and_why(api, make_todo):
    todo = make_todo("jobs")
    response = api.post(f"/todos/{todo.id}/cancel/", {"reason": "not needed"})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "cancelled"
    todo.refresh_from_db()
    assert todo.state == TodoState.CANCELLED and todo.completed_at is not None
    entry = todo.errors[-1]
    assert (entry["error"], entry["cancelled_by"], entry["reason"], entry["was"]) == (
        "cancelled",
        "alice",
        "not needed",
        "pending",
    )


def test_after_a_claimed_todo_is_cancelled_the_workers_heartbeat_is_409_cancelled(api, make_agent, api_for, make_todo):
    todo = make_todo("jobs")
    worker = make_agent("worker", claim=["jobs"])
    [claimed] = queue.claim_next(agent=worker)
    assert api.post(f"/todos/{todo.id}/cancel/").status_code == 200

    worker_api = api_for(worker)
    beat = worker_api.post(f"/todos/{todo.id}/heartbeat/", {"lease_id": claimed.lease_id})
    assert beat.status_code == 409
    assert beat.json()["error"]["state"] == "cancelled"

    done = worker_api.post(f"/todos/{todo.id}/complete/", {"lease_id": claimed.lease_id, "result": {"x": 1}})
    assert done.status_code == 409 and done.json()["error"]["state"] == "cancelled"
    failed = worker_api.post(f"/todos/{todo.id}/fail/", {"lease_id": claimed.lease_id, "error": "boom"})
    assert failed.status_code == 409
    todo.refresh_from_db()
    assert todo.state == TodoState.CANCELLED and todo.result is None
    assert [e["error"] for e in todo.errors] == ["cancelled"]
    assert todo.errors[-1]["was"] == "claimed" and todo.errors[-1]["owner"] == "worker"


def test_cancel_a_retry_waiting_todo(api, make_todo):
    from datetime import timedelta

    from django.db.models.functions import Now

    todo = make_todo("jobs", state=TodoState.FAILED, next_retry_at=Now() + timedelta(hours=1), attempt=1)
    assert api.post(f"/todos/{todo.id}/cancel/").status_code == 200
    todo.refresh_from_db()
    assert todo.state == TodoState.CANCELLED and todo.next_retry_at is None


def test_cancel_a_scheduled_todo_and_it_never_comes_due(api, agent):
    todo, _ = queue.create(queue="jobs", title="later", delay_seconds=3600)
    assert todo.state == TodoState.SCHEDULED
    response = api.post(f"/todos/{todo.id}/cancel/", {"reason": "not needed"})
    assert response.status_code == 200, response.content
    todo.refresh_from_db()
    assert todo.state == TodoState.CANCELLED and todo.errors[-1]["was"] == "scheduled"
    assert queue.claim_next(agent=agent, queues=["jobs"]) == []


@pytest.mark.parametrize("state", [TodoState.DONE, TodoState.FAILED, TodoState.CANCELLED])
def test_cancel_of_a_finished_or_dead_todo_is_conflict_and_changes_nothing(api, make_todo, state):
    todo = make_todo("jobs", state=state, attempt=5)
    before = Todo.objects.get(pk=todo.pk)
    response = api.post(f"/todos/{todo.id}/cancel/")
    assert response.status_code == 409
    assert response.json()["error"]["state"] == state
    after = Todo.objects.get(pk=todo.pk)
    assert (after.state, after.errors, after.updated_at) == (before.state, before.errors, before.updated_at)


def test_cancel_outside_the_agents_scopes_is_not_found(make_agent, api_for, make_todo):
    todo = make_todo("jobs")
    outsider = api_for(make_agent("bob", claim=["other"]))
    assert outsider.post(f"/todos/{todo.id}/cancel/").status_code == 404
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def test_an_agent_that_may_only_create_in_the_queue_may_cancel(make_agent, api_for, make_todo):
    todo = make_todo("jobs")
    producer = api_for(make_agent("producer", claim=["other"], create=["jobs"]))
    assert producer.post(f"/todos/{todo.id}/cancel/").status_code == 200


def test_staff_cancel_on_a_session(django_user_model, client, make_todo):
    todo = make_todo("jobs")
    client.force_login(django_user_model.objects.create_user("root", is_staff=True, is_superuser=True))
    response = client.post(f"/api/v1/todos/{todo.id}/cancel/", data="{}", content_type="application/json")
    assert response.status_code == 200
    todo.refresh_from_db()
    assert todo.errors[-1]["cancelled_by"] == "staff:root"


def test_cancel_frees_the_idempotency_key(api, make_todo):
    todo = make_todo("jobs", idempotency_key="k1")
    api.post(f"/todos/{todo.id}/cancel/")
    response = api.post("/todos/", {"queue": "jobs", "idempotency_key": "k1"})
    assert response.status_code == 201 and response.json()["id"] != todo.id


def test_cancelled_is_a_list_filter(api, make_todo):
    todo = make_todo("jobs")
    make_todo("jobs")
    api.post(f"/todos/{todo.id}/cancel/")
    listed = api.get("/todos/", state="cancelled").json()["results"]
    assert [t["id"] for t in listed] == [todo.id]


def test_a_too_long_reason_is_invalid(api, make_todo):
    todo = make_todo("jobs")
    response = api.post(f"/todos/{todo.id}/cancel/", {"reason": "x" * 5000})
    assert response.status_code == 400 and "reason" in response.json()["error"]["fields"]
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


# --- pause and resume -----------------------------------------------------------------------------


def test_pause_and_resume_by_a_managing_agent(manager, make_todo):
    make_todo("jobs")
    response = manager.post("/queues/jobs/pause/")
    assert response.status_code == 200
    assert response.json() == {
        "queue": "jobs",
        "paused": True,
        "max_claimed": None,
        "rate_per_second": None,
        "rate_burst": None,
        "fair": False,
        "fair_weights": {},
        "max_claimed_per_key": None,
        "max_depth": None,
        "max_children": None,
        "max_descendants": None,
        "limits": None,
        "rate_per_key": None,
    }
    assert Queue.objects.get(name="jobs").paused
    assert manager.post("/queues/jobs/resume/").json()["paused"] is False
    assert not Queue.objects.get(name="jobs").paused


def test_pause_by_an_agent_without_the_right_is_forbidden(api, make_todo):
    make_todo("jobs")
    response = api.post("/queues/jobs/pause/")
    assert response.status_code == 403
    assert not Queue.objects.get(name="jobs").paused


def test_pause_of_a_queue_outside_the_managers_scopes_is_not_found(manager, make_todo):
    make_todo("other")
    assert manager.post("/queues/other/pause/").status_code == 404
    assert not Queue.objects.get(name="other").paused


def test_pause_of_an_unknown_queue_is_not_found(manager):
    response = manager.post("/queues/jobs.nope/pause/")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_staff_pause_on_a_session(django_user_model, client, make_todo):
    make_todo("a/b")  # queue names may hold a slash
    client.force_login(django_user_model.objects.create_user("root", is_staff=True, is_superuser=True))
    assert client.post("/api/v1/queues/a/b/pause/").status_code == 200
    assert Queue.objects.get(name="a/b").paused


def test_the_queue_list_shows_paused_and_limits(manager, make_todo):
    make_todo("jobs")
    manager.post("/queues/jobs/pause/")
    _patch(manager, "/queues/jobs/", {"max_claimed": 2})
    [row] = manager.get("/queues/").json()["queues"]
    assert (row["paused"], row["max_claimed"], row["rate_per_second"], row["cancelled"]) == (True, 2, None, 0)


# --- limits ---------------------------------------------------------------------------------------


def test_patch_sets_the_limits_and_answers_them(manager, make_todo):
    make_todo("jobs")
    response = _patch(manager, "/queues/jobs/", {"max_claimed": 3, "rate_per_second": 20, "rate_burst": 5})
    assert response.status_code == 200, response.content
    assert response.json() == {
        "queue": "jobs",
        "paused": False,
        "max_claimed": 3,
        "rate_per_second": 20.0,
        "rate_burst": 5,
        "fair": False,
        "fair_weights": {},
        "max_claimed_per_key": None,
        "max_depth": None,
        "max_children": None,
        "max_descendants": None,
        "limits": None,
        "rate_per_key": None,
    }
    row = Queue.objects.get(name="jobs")
    assert (row.max_claimed, row.rate_per_second, row.rate_burst, row.tokens) == (3, 20.0, 5, 5.0)


def test_patch_changes_only_the_fields_given_and_null_removes_one(manager, make_todo):
    make_todo("jobs")
    _patch(manager, "/queues/jobs/", {"max_claimed": 3, "rate_per_second": 20})
    body = _patch(manager, "/queues/jobs/", {"max_claimed": None}).json()
    assert (body["max_claimed"], body["rate_per_second"], body["rate_burst"]) == (None, 20.0, 20)


@pytest.mark.parametrize(
    "body,field",
    [
        ({"max_claimed": -1}, "max_claimed"),
        ({"max_claimed": "lots"}, "max_claimed"),
        ({"max_claimed": 10**12}, "max_claimed"),
        ({"rate_per_second": 0}, "rate_per_second"),
        ({"rate_per_second": -5}, "rate_per_second"),
        ({"rate_per_second": 1e12}, "rate_per_second"),
        ({"rate_per_second": 5, "rate_burst": 0}, "rate_burst"),
        ({"rate_burst": 5}, "rate_burst"),  # no rate to burst
    ],
)
def test_patch_with_a_bad_value_is_400_naming_the_field_and_changes_nothing(manager, make_todo, body, field):
    make_todo("jobs")
    response = _patch(manager, "/queues/jobs/", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    row = Queue.objects.get(name="jobs")
    assert (row.max_claimed, row.rate_per_second, row.rate_burst) == (None, None, None)


def test_patch_with_nothing_to_change_is_invalid(manager, make_todo):
    make_todo("jobs")
    assert _patch(manager, "/queues/jobs/", {}).status_code == 400


def test_patch_of_an_unknown_queue_is_not_found(manager):
    assert _patch(manager, "/queues/jobs.nope/", {"max_claimed": 1}).status_code == 404


def test_patch_takes_effect_on_the_next_claim(manager, make_agent, api_for, make_todo):
    for _ in range(3):
        make_todo("jobs")
    worker = api_for(make_agent("worker", claim=["jobs"]))
    _patch(manager, "/queues/jobs/", {"max_claimed": 1})
    assert len(worker.post("/todos/claim/", {"limit": 3}).json()["todos"]) == 1
    _patch(manager, "/queues/jobs/", {"max_claimed": 3})
    assert len(worker.post("/todos/claim/", {"limit": 3}).json()["todos"]) == 2


def test_claim_one_refused_by_a_limit_is_409_saying_why(manager, make_agent, api_for, make_todo):
    first, second = make_todo("jobs"), make_todo("jobs")
    worker = api_for(make_agent("worker", claim=["jobs"]))
    _patch(manager, "/queues/jobs/", {"max_claimed": 1})
    assert worker.post(f"/todos/{first.id}/claim/").status_code == 200
    refused = worker.post(f"/todos/{second.id}/claim/")
    assert refused.status_code == 409
    assert refused.json()["error"]["reason"] == "queue_limit"
