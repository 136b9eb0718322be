"""Fair share over HTTP (issue 22): fair_key on create, in the JSON and as a filter; a queue's fair
settings set by PATCH and shown by GET; bad values a 400 naming the field, with nothing changed."""

from __future__ import annotations

import json

import pytest

from todos.models import Queue, Todo

pytestmark = pytest.mark.django_db


@pytest.fixture
def manager(make_agent, api_for):
    return api_for(make_agent("ops", claim=["jobs*"], create=["jobs*"], can_manage_queues=True))


def _patch(api, path, body):
    return api.client.patch("/api/v1" + path, data=json.dumps(body), content_type="application/json")


def test_create_takes_a_fair_key_that_shows_in_the_json_and_filters_the_list(manager):
    response = manager.post("/todos/", {"queue": "jobs", "title": "review", "fair_key": "acme/widgets#12"})
    assert response.status_code == 201, response.content
    assert response.json()["fair_key"] == "acme/widgets#12"
    manager.post("/todos/", {"queue": "jobs", "title": "other"})
    listed = manager.get("/todos/", fair_key="acme/widgets#12").json()["results"]
    assert [t["title"] for t in listed] == ["review"]
    assert manager.get(f"/todos/{listed[0]['id']}/").json()["fair_key"] == "acme/widgets#12"


def test_a_fair_key_too_long_is_400_naming_it_and_creates_nothing(manager):
    response = manager.post("/todos/", {"queue": "jobs", "fair_key": "k" * 201})
    assert response.status_code == 400
    assert "fair_key" in response.json()["error"]["fields"]
    assert not Todo.objects.exists()


def test_patch_sets_fair_share_and_get_shows_it(manager):
    manager.post("/todos/", {"queue": "jobs", "fair_key": "a"})
    body = {"fair": True, "fair_weights": {"a": 3, "b": 0.5}, "max_claimed_per_key": 1}
    response = _patch(manager, "/queues/jobs/", body)
    assert response.status_code == 200, response.content
    shown = manager.get("/queues/jobs/").json()
    assert (shown["fair"], shown["fair_weights"], shown["max_claimed_per_key"]) == (True, {"a": 3, "b": 0.5}, 1)
    # Only the fields given change; null puts a setting back.
    shown = _patch(manager, "/queues/jobs/", {"max_claimed_per_key": None}).json()
    assert (shown["fair"], shown["fair_weights"], shown["max_claimed_per_key"]) == (True, {"a": 3, "b": 0.5}, None)


@pytest.mark.parametrize(
    "body,field",
    [
        ({"fair_weights": {"a": 0}}, "fair_weights"),
        ({"fair_weights": {"a": -1}}, "fair_weights"),
        ({"fair_weights": {"a": "heavy"}}, "fair_weights"),
        ({"fair_weights": {"k" * 201: 2}}, "fair_weights"),
        ({"fair_weights": [1, 2]}, "fair_weights"),
        ({"fair": "yes"}, "fair"),
        ({"max_claimed_per_key": 0}, "max_claimed_per_key"),
        ({"fair": True, "max_claimed_per_key": -2}, "max_claimed_per_key"),
    ],
)
def test_a_bad_fair_setting_is_400_naming_the_field_and_changes_nothing(manager, body, field):
    manager.post("/todos/", {"queue": "jobs"})
    response = _patch(manager, "/queues/jobs/", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    row = Queue.objects.get(name="jobs")
    assert (row.fair, row.fair_weights, row.max_claimed_per_key) == (False, {}, None)


@pytest.mark.parametrize(
    "body", [{"fair": True}, {"fair_weights": {"a": 2}}, {"max_claimed_per_key": 1}, {"fair": True, "fair_weights": {}}]
)
def test_fair_on_an_unknown_queue_is_not_found_naming_the_queue_and_creates_no_queue(manager, body):
    response = _patch(manager, "/queues/jobs.nope/", body)
    assert response.status_code == 404, response.content
    error = response.json()["error"]
    assert error["code"] == "not_found"
    assert error["fields"] == {"queue": ["No queue 'jobs.nope'."]}
    assert not Queue.objects.filter(name="jobs.nope").exists()
    assert manager.get("/queues/jobs.nope/").json()["error"]["fields"] == {"queue": ["No queue 'jobs.nope'."]}


def test_a_bad_fair_setting_on_an_unknown_queue_is_400_naming_the_field(manager):
    """The body is checked before the queue is looked up: a bad value is named whatever the URL."""
    response = _patch(manager, "/queues/jobs.nope/", {"fair_weights": {"a": 0}})
    assert response.status_code == 400
    assert "fair_weights" in response.json()["error"]["fields"]


def test_an_agent_without_can_manage_may_not_make_a_queue_fair(make_agent, api_for, manager):
    manager.post("/todos/", {"queue": "jobs"})
    plain = api_for(make_agent("worker", claim=["jobs*"]))
    assert _patch(plain, "/queues/jobs/", {"fair": True}).status_code == 403
    assert not Queue.objects.get(name="jobs").fair


def test_claims_over_http_on_a_fair_queue_take_keys_in_turn(manager):
    for key in ("a", "a", "a", "b", "b", "b"):
        manager.post("/todos/", {"queue": "jobs", "fair_key": key})
    _patch(manager, "/queues/jobs/", {"fair": True})
    keys = []
    for _ in range(5):
        [todo] = manager.post("/todos/claim/", {"queues": ["jobs"], "limit": 1}).json()["todos"]
        keys.append(todo["fair_key"])
    assert keys == ["a", "b", "a", "b", "a"]
