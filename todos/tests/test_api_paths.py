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
