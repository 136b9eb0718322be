"""Scope isolation: an agent can neither see nor touch a todo outside its scopes. Every verb answers
404 (never 403: ids do not leak), and lists and queue counts show nothing of it."""

from __future__ import annotations

import pytest

from todos import queue
from todos.models import Todo, TodoState


@pytest.fixture
def alice(make_agent):
    return make_agent("alice", claim=["alpha.*"], can_retry_dead_letters=True)


@pytest.fixture
def bob(make_agent):
    return make_agent("bob", claim=["beta.*"], can_retry_dead_letters=True)


@pytest.fixture
def alices_claim(alice):
    queue.create(queue="alpha.jobs", title="alice's")
    [todo] = queue.claim_next(agent=alice)
    return todo


VERBS = [
    ("get", "/todos/{id}/", None),
    ("post", "/todos/{id}/claim/", {}),
    ("post", "/todos/{id}/heartbeat/", {"lease_id": "{lease}"}),
    ("post", "/todos/{id}/complete/", {"lease_id": "{lease}"}),
    ("post", "/todos/{id}/fail/", {"lease_id": "{lease}"}),
    ("post", "/todos/{id}/release/", {"lease_id": "{lease}"}),
    ("post", "/todos/{id}/retry/", {"mode": "reset"}),
]


@pytest.mark.parametrize("method, path, body", VERBS)
def test_every_verb_on_another_agents_todo_is_not_found(alices_claim, bob, api_for, method, path, body):
    # bob even holds alice's receipt: scope comes first.
    path = path.format(id=alices_claim.id)
    if body:
        body = {k: v.format(lease=alices_claim.lease_id) for k, v in body.items()}
    api = api_for(bob)
    response = api.get(path) if method == "get" else api.post(path, body)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    stored = Todo.objects.get(pk=alices_claim.id)
    assert stored.state == TodoState.CLAIMED and stored.owner == "alice"
    assert stored.lease_id == alices_claim.lease_id and stored.updated_at == alices_claim.updated_at


def test_retry_out_of_scope_without_the_right_is_not_found_not_forbidden(make_agent, api_for):
    carol = make_agent("carol", claim=["gamma.*"])
    todo, _ = queue.create(queue="alpha.x")
    Todo.objects.filter(pk=todo.pk).update(state=TodoState.FAILED, next_retry_at=None)
    response = api_for(carol).post(f"/todos/{todo.id}/retry/", {"mode": "reset"})
    assert response.status_code == 404


def test_batch_complete_of_another_agents_todo_is_not_found_per_item(alices_claim, bob, api_for):
    response = api_for(bob).post(
        "/todos/complete/", {"items": [{"id": alices_claim.id, "lease_id": alices_claim.lease_id}]}
    )
    assert response.status_code == 200
    [outcome] = response.json()["outcomes"]
    assert outcome["status"] == 404 and outcome["error"]["code"] == "not_found"
    assert Todo.objects.get(pk=alices_claim.id).state == TodoState.CLAIMED


def test_claim_next_never_takes_another_agents_queue(alice, bob, api_for):
    queue.create(queue="alpha.jobs")
    response = api_for(bob).post("/todos/claim/", {"queues": ["alpha.*"]})
    # Refused at once and named (it is the caller's own request, so nothing leaks), not an empty wait.
    assert response.status_code == 403
    assert response.json()["error"] == {
        "code": "forbidden",
        "detail": "Outside this agent's claim scopes: alpha.*.",
        "queues": ["alpha.*"],
    }
    assert Todo.objects.get().state == TodoState.PENDING


def test_list_shows_only_the_callers_scopes(alice, bob, api_for):
    mine, _ = queue.create(queue="beta.x")
    queue.create(queue="alpha.x")
    for params in ({}, {"queue": "alpha.x"}, {"state": "pending"}):
        ids = [t["id"] for t in api_for(bob).get("/todos/", **params).json()["results"]]
        assert ids == ([mine.id] if params.get("queue") != "alpha.x" else [])


def test_queue_counts_show_only_the_callers_queues(alice, bob, api_for):
    queue.create(queue="alpha.x")
    queue.create(queue="beta.y")
    names = [q["queue"] for q in api_for(bob).get("/queues/").json()["queues"]]
    assert names == ["beta.y"]


def test_create_scopes_make_a_queue_visible_but_not_claimable(make_agent, api_for):
    producer = make_agent("producer", claim=[], create=["jobs.*"])
    api = api_for(producer)
    created = api.post("/todos/", {"queue": "jobs.a"}).json()
    assert api.get(f"/todos/{created['id']}/").status_code == 200
    assert api.post("/todos/claim/", {}).json() == {"todos": []}
    # Visible (no leak), but not in its claim scopes: the claim guard fails, a conflict.
    assert api.post(f"/todos/{created['id']}/claim/").status_code == 409
