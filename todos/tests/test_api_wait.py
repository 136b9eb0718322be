"""The wait endpoints over HTTP (issue 20): wait, resolve by an agent, resolve by token with no other
credential, and bad input answered 400 naming the field with nothing written."""

from __future__ import annotations

import pytest

from todos import queue
from todos.models import Todo, TodoState, Waitpoint

pytestmark = pytest.mark.django_db

DAY = 86400


def _claim(api, make_todo, queue_name="jobs"):
    todo = make_todo(queue_name)
    return api.post(f"/todos/{todo.id}/claim/").json()


def test_a_token_wait_shows_the_token_once_and_its_url_resolves_it_without_credentials(api, make_todo, client):
    claimed = _claim(api, make_todo)
    answer = api.post(
        f"/todos/{claimed['id']}/wait/",
        {"lease_id": claimed["lease_id"], "for": {"token": True}, "timeout_seconds": DAY},
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["state"] == "waiting" and body["waiting_for"] == {"token": True}
    token, url = body["waitpoint"]["token"], body["waitpoint"]["resolve_url"]
    assert url.endswith(f"/api/v1/waitpoints/{token}/resolve/")
    shown = api.get(f"/todos/{claimed['id']}/").json()
    assert shown["state"] == "waiting" and token not in str(shown) and "waitpoint" not in shown

    first = client.post(url, {"data": {"approved": True}}, content_type="application/json")
    second = client.post(url, {"data": {"approved": False}}, content_type="application/json")
    assert (first.status_code, second.status_code) == (200, 409)
    again = api.post("/todos/claim/").json()["todos"][0]
    assert again["id"] == claimed["id"]
    assert again["resolution"]["by"] == "token" and again["resolution"]["data"] == {"approved": True}
    assert again["waiting_for"] is None


def test_an_unknown_token_is_404(client, db):
    response = client.post("/api/v1/waitpoints/wpt_unknown/resolve/", {}, content_type="application/json")
    assert response.status_code == 404


def test_a_parent_reads_its_childrens_results_from_its_next_claim(api, make_todo):
    kids = [_claim(api, make_todo, "kids") for _ in range(2)]
    parent = _claim(api, make_todo)
    answer = api.post(
        f"/todos/{parent['id']}/wait/",
        {"lease_id": parent["lease_id"], "for": {"todos": [k["id"] for k in kids]}, "timeout_seconds": DAY},
    )
    assert answer.json()["waiting_for"] == {"todos": [k["id"] for k in kids]}
    for n, kid in enumerate(kids):
        api.post(f"/todos/{kid['id']}/complete/", {"lease_id": kid["lease_id"], "result": {"n": n}})
    again = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"][0]
    assert again["resolution"]["by"] == "todos"
    assert again["resolution"]["todos"] == [
        {"id": kids[0]["id"], "state": "done", "result": {"n": 0}},
        {"id": kids[1]["id"], "state": "done", "result": {"n": 1}},
    ]


def test_an_agent_the_wait_names_resolves_it(api, make_todo, make_agent, api_for):
    claimed = _claim(api, make_todo)
    api.post(
        f"/todos/{claimed['id']}/wait/",
        {"lease_id": claimed["lease_id"], "for": {"token": True}, "timeout_seconds": 60, "resolvers": ["merger"]},
    )
    outsider = api_for(make_agent("outsider", claim=["elsewhere"]))
    assert outsider.post(f"/todos/{claimed['id']}/resolve/", {"data": 1}).status_code == 404
    merger = api_for(make_agent("merger", claim=["*"]))
    answer = merger.post(f"/todos/{claimed['id']}/resolve/", {"data": {"merged": True}})
    assert answer.status_code == 200
    assert answer.json()["state"] == "pending" and answer.json()["resolution"]["data"] == {"merged": True}
    assert answer.json()["resolution"]["resolved_by"] == "merger"
    assert merger.post(f"/todos/{claimed['id']}/resolve/", {"data": 1}).status_code == 409


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"for": {"token": True}}, "timeout_seconds"),
        ({"for": {"token": True}, "timeout_seconds": 31 * DAY}, "timeout_seconds"),
        ({"for": {"token": True}, "timeout_seconds": DAY, "on_timeout": "explode"}, "on_timeout"),
        ({"for": {"token": True}, "timeout_seconds": DAY, "colour": "red"}, "colour"),
        ({"for": {"todos": [f"td_{i:032x}" for i in range(101)]}, "timeout_seconds": DAY}, "for.todos"),
        ({"for": {"event": {"source": "gh", "match": {"a": [1]}}}, "timeout_seconds": DAY}, "for.event.match"),
        ({"for": {}, "timeout_seconds": DAY}, "for"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(api, make_todo, body, field):
    claimed = _claim(api, make_todo)
    answer = api.post(f"/todos/{claimed['id']}/wait/", {"lease_id": claimed["lease_id"], **body})
    assert answer.status_code == 400
    assert field in answer.json()["error"]["fields"]
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.CLAIMED
    assert not Waitpoint.objects.exists()


def test_an_unknown_awaited_todo_is_404_naming_it(api, make_todo):
    claimed = _claim(api, make_todo)
    ghost = "td_" + "0" * 32
    answer = api.post(
        f"/todos/{claimed['id']}/wait/",
        {"lease_id": claimed["lease_id"], "for": {"todos": [ghost]}, "timeout_seconds": DAY},
    )
    assert answer.status_code == 404 and ghost in answer.json()["error"]["detail"]
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.CLAIMED


def test_a_wait_with_a_stale_receipt_is_409(api, make_todo, agent):
    claimed = _claim(api, make_todo)
    queue.release(claimed["id"], agent=agent, lease_id=claimed["lease_id"])
    answer = api.post(
        f"/todos/{claimed['id']}/wait/",
        {"lease_id": claimed["lease_id"], "for": {"token": True}, "timeout_seconds": DAY},
    )
    assert answer.status_code == 409
