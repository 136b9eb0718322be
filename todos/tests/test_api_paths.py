"""Every path under /api/ answers JSON, DEBUG on or off: unknown paths, wrong methods, missing slashes."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from todos.models import Todo


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


def _error(response, status):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), response.content[:300]
    return json.loads(response.content)["error"]


def test_post_without_the_trailing_slash_is_a_json_404_naming_the_right_path(api, debug):
    response = api.client.post("/api/v1/todos", data='{"queue": "q"}', content_type="application/json")
    error = _error(response, 404)
    assert error["code"] == "not_found"
    assert error["path"] == "/api/v1/todos/"
    assert not Todo.objects.exists()


def test_get_without_the_trailing_slash_is_a_json_404_too(api, debug):
    error = _error(api.client.get("/api/v1/todos/claim"), 404)
    assert error["path"] == "/api/v1/todos/claim/"


def test_unknown_api_path_is_a_json_404_without_a_suggestion(api, debug):
    error = _error(api.client.get("/api/v1/nothing/here/"), 404)
    assert error["code"] == "not_found" and "path" not in error
    _error(api.client.get("/api/v2/todos/"), 404)


def test_unknown_path_is_json_even_for_an_anonymous_session_post(debug):
    # No token, no CSRF cookie: still the JSON 404, not Django's CSRF page.
    client = Client(enforce_csrf_checks=True)
    error = _error(client.post("/api/v1/todo/", data="{}", content_type="application/json"), 404)
    assert error["code"] == "not_found"


def test_wrong_method_is_405_with_allow(api, debug):
    response = api.client.delete("/api/v1/todos/claim/")
    error = _error(response, 405)
    assert error["code"] == "method_not_allowed"
    assert "POST" in response["Allow"]


def test_api_root_names_the_api_paths_and_refuses_posts(debug):
    response = Client().get("/api/v1/")
    assert response.status_code == 200
    assert response.json()["todos"].endswith("/api/v1/todos/")
    assert response.json()["docs"].endswith("/api/docs/")
    response = Client().post("/api/v1/")
    assert _error(response, 405)["code"] == "method_not_allowed" and response["Allow"] == "GET, HEAD"


def test_unexpected_error_in_an_api_view_is_json_500(api, debug, monkeypatch):
    from todos import queue

    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(queue, "claim_next", boom)
    client = api.client
    client.raise_request_exception = False
    response = client.post("/api/v1/todos/claim/", data="{}", content_type="application/json")
    error = _error(response, 500)
    assert error["code"] == "internal" and "kaboom" not in response.content.decode()


# --- strict input -------------------------------------------------------------------------------------


def test_create_with_a_misspelt_field_is_invalid_naming_it_and_stores_nothing(api):
    error = _error(api.post("/todos/", {"queue": "q", "titel": "PR 42"}), 400)
    assert error["code"] == "invalid"
    assert list(error["fields"]) == ["titel"]
    assert "title" in error["fields"]["titel"][0]
    assert not Todo.objects.exists()


@pytest.mark.parametrize(
    "path, body",
    [
        ("/todos/claim/", {"queue": ["q"]}),
        ("/todos/td_x/claim/", {"lease": 5}),
        ("/todos/td_x/heartbeat/", {"lease_id": "ls_x", "lease": 5}),
        ("/todos/td_x/complete/", {"lease_id": "ls_x", "results": {}}),
        ("/todos/td_x/fail/", {"lease_id": "ls_x", "reason": "x"}),
        ("/todos/td_x/release/", {"lease_id": "ls_x", "why": "x"}),
        ("/todos/complete/", {"items": [], "all": True}),
    ],
)
def test_every_write_refuses_unknown_fields(api, path, body):
    error = _error(api.post(path, body), 400)
    assert error["code"] == "invalid"
    assert set(body) - {"lease_id", "items"} <= set(error["fields"])


def test_batch_complete_refuses_unknown_fields_inside_items(api, make_todo):
    todo = make_todo("q")
    error = _error(api.post("/todos/complete/", {"items": [{"id": todo.id, "lease_id": "ls_x", "res": 1}]}), 400)
    assert "res" in str(error["fields"]["items"])


def test_retry_refuses_unknown_fields(make_agent, api_for, make_todo):
    api = api_for(make_agent("ops", can_retry_dead_letters=True))
    todo = make_todo("q", state="failed", attempt=5, max_attempts=5)
    error = _error(api.post(f"/todos/{todo.id}/retry/", {"mode": "once", "notes": "x"}), 400)
    assert list(error["fields"]) == ["notes"]
    todo.refresh_from_db()
    assert todo.state == "failed"


def test_claim_naming_queues_outside_the_scopes_is_403_naming_them(make_agent, api_for, make_todo):
    api = api_for(make_agent("narrow", claim=["github.*", "demo"]))
    make_todo("demo")
    response = api.post("/todos/claim/", {"queues": ["demo", "stripe.events", "billing.*"], "wait_seconds": 20})
    error = _error(response, 403)
    assert error["code"] == "forbidden"
    assert error["queues"] == ["stripe.events", "billing.*"]
    assert Todo.objects.get().state == "pending"  # nothing was claimed from the allowed one either


@pytest.mark.parametrize("queues", [["github.prs"], ["github.*"], ["github.p*"], ["*"], ["demo"]])
def test_claim_naming_queues_that_meet_the_scopes_is_allowed(make_agent, api_for, queues):
    api = api_for(make_agent("narrow", claim=["github.*", "demo"]))
    response = api.post("/todos/claim/", {"queues": queues})
    assert response.status_code == 200 and response.json() == {"todos": []}


def test_no_content_type_is_415(api):
    response = api.client.post("/api/v1/todos/", data="queue=q", content_type="text/plain")
    assert _error(response, 415)["code"] == "invalid"
