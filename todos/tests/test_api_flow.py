"""Named limits over HTTP (issue 31): PUT/GET/DELETE /api/v1/limits/<name>/, ``limits`` on create, batch
items and a queue's PATCH, in the todo's JSON; bad values a 400 naming the field, with nothing changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from todos.models import Limit, Queue, Todo

pytestmark = pytest.mark.django_db


@pytest.fixture
def manager(make_agent: Any, api_for: Any) -> Any:
    return api_for(make_agent("ops", claim=["jobs*"], create=["jobs*"], can_manage_queues=True))


def put(api: Any, name: str, body: Any) -> Any:
    return api.client.put(f"/api/v1/limits/{name}/", data=json.dumps(body), content_type="application/json")


def delete(api: Any, name: str) -> Any:
    return api.client.delete(f"/api/v1/limits/{name}/")


def test_put_creates_then_replaces_a_limit_get_shows_it_delete_removes_it(manager: Any) -> None:
    response = put(manager, "openai", {"max_claimed": 8, "rate_per_second": 2})
    assert response.status_code == 201, response.content
    shown = response.json()
    assert (shown["name"], shown["max_claimed"], shown["rate_per_second"], shown["rate_burst"]) == ("openai", 8, 2, 2)
    assert shown["parked"] is None
    response = put(manager, "openai", {"per_key": 2})
    assert response.status_code == 200
    assert (response.json()["max_claimed"], response.json()["per_key"]) == (None, 2), "PUT sets the whole limit"
    assert manager.get("/limits/openai/").json()["per_key"] == 2
    assert delete(manager, "openai").status_code == 200
    assert manager.get("/limits/openai/").status_code == 404
    assert delete(manager, "openai").status_code == 404


def test_create_and_batch_items_name_limits_shown_on_the_todo(manager: Any) -> None:
    response = manager.post("/todos/", {"queue": "jobs", "title": "review", "limits": ["openai", "github"]})
    assert response.status_code == 201, response.content
    assert response.json()["limits"] == ["github", "openai"]
    assert manager.post("/todos/", {"queue": "jobs", "title": "plain"}).json()["limits"] == []
    batch = manager.post("/todos/batch/", {"todos": [{"queue": "jobs", "limits": ["openai"]}, {"queue": "jobs"}]})
    assert batch.status_code == 200, batch.content
    assert sorted(str(t.limits) for t in Todo.objects.all()) == sorted(
        ["['github', 'openai']", "None", "['openai']", "None"]
    )


def test_a_queue_patch_names_limits_and_null_removes_them(manager: Any) -> None:
    manager.post("/todos/", {"queue": "jobs"})
    response = manager.client.patch(
        "/api/v1/queues/jobs/", data=json.dumps({"limits": ["openai"]}), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["limits"] == ["openai"]
    response = manager.client.patch(
        "/api/v1/queues/jobs/", data=json.dumps({"limits": []}), content_type="application/json"
    )
    assert response.json()["limits"] is None
    assert Queue.objects.get(name="jobs").limits is None


@pytest.mark.parametrize(
    "body,field",
    [
        ({"max_claimed": -1}, "max_claimed"),
        ({"max_claimed": "many"}, "max_claimed"),
        ({"rate_per_second": 0}, "rate_per_second"),
        ({"rate_burst": 5}, "rate_burst"),
        ({"per_key": 0}, "per_key"),
        ({"max_claimed": 1, "surprise": 1}, "surprise"),
    ],
)
def test_bad_limit_settings_are_400_naming_the_field_and_change_nothing(manager: Any, body: Any, field: str) -> None:
    response = put(manager, "openai", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not Limit.objects.exists()


@pytest.mark.parametrize(
    "limits",
    [["bad name"], ["-dash"], ["x" * 101], ["a", "b", "c", "d", "e"], "openai", [None], [{"a": 1}]],
)
def test_bad_limit_names_on_create_are_400_naming_limits(manager: Any, limits: Any) -> None:
    response = manager.post("/todos/", {"queue": "jobs", "limits": limits})
    assert response.status_code == 400, response.content
    assert "limits" in response.json()["error"]["fields"]
    assert not Todo.objects.exists()


def test_a_bad_limit_name_in_the_url_is_400_on_put_and_404_on_get(manager: Any) -> None:
    assert put(manager, "bad%20name", {"max_claimed": 1}).status_code == 400
    assert manager.get("/limits/bad%20name/").status_code == 404
