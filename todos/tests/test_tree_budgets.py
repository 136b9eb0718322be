"""Budgets (issue 30, item 4): usage reported on heartbeat and complete under the receipt, added to the todo's
and rolled up to its root's in the same statement; a root's budget, once a counter reaches it, makes claims
skip the tree's todos (blocked: budget, not failed) and tells a running todo's heartbeat budget_exhausted,
until an operator raises it (PATCH /todos/<id>/budget/)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from todos import queue
from todos.errors import InvalidTransitionInput
from todos.models import Agent, Todo, TodoState

pytestmark = pytest.mark.django_db


def _held(agent: Agent, queue_name: str = "jobs", **create: Any) -> Todo:
    todo, _ = queue.create(queue=queue_name, **create)
    return queue.claim(todo.id, agent=agent)


def _receipt(todo: Todo) -> dict[str, str]:
    return {"id": todo.id, "lease_id": str(todo.lease_id)}


def _child(agent: Agent, parent: Todo, **create: Any) -> Todo:
    return queue.create(queue="jobs", agent=agent, parent=_receipt(parent), **create)[0]


def _numbers(counters: dict[str, Any] | None) -> dict[str, Decimal]:
    return {k: Decimal(str(v)) for k, v in (counters or {}).items()}


def test_usage_on_heartbeat_and_complete_adds_up_on_the_todo_and_its_root(api, agent):
    root = _held(agent)
    child = queue.claim(_child(agent, root).id, agent=agent)
    beat = api.post(f"/todos/{child.id}/heartbeat/", {"lease_id": child.lease_id, "usage": {"tokens_in": 100}})
    assert beat.status_code == 200, beat.json()
    assert beat.json()["usage"] == {"tokens_in": 100} and beat.json()["budget_exhausted"] is False
    done = api.post(
        f"/todos/{child.id}/complete/",
        {"lease_id": child.lease_id, "result": {}, "usage": {"tokens_in": 50, "cost_usd": 0.25}},
    )
    assert done.status_code == 200, done.json()
    assert _numbers(done.json()["usage"]) == {"tokens_in": 150, "cost_usd": Decimal("0.25")}
    api.post(f"/todos/{root.id}/heartbeat/", {"lease_id": root.lease_id, "usage": {"cost_usd": 0.5}})
    shown = api.get(f"/todos/{root.id}/").json()
    assert _numbers(shown["usage"]) == {"cost_usd": Decimal("0.5")}
    assert _numbers(shown["tree_usage"]) == {"tokens_in": 150, "cost_usd": Decimal("0.75")}


def test_a_spent_budget_blocks_the_trees_claims_until_an_operator_raises_it(api, api_for, agent, make_agent):
    root = _held(agent, budget={"cost_usd": 1})
    worker = queue.claim(_child(agent, root).id, agent=agent)
    waiting = _child(agent, root, title="not yet")
    other, _ = queue.create(queue="jobs", title="another tree")
    beat = api.post(f"/todos/{worker.id}/heartbeat/", {"lease_id": worker.lease_id, "usage": {"cost_usd": 1}})
    assert beat.json()["budget_exhausted"] is True and beat.json()["state"] == "claimed"
    assert Todo.objects.get(pk=root.id).budget_exhausted is True
    # Claims skip the tree's todos (the other tree's is taken); they show blocked: budget, not failed.
    claimed = queue.claim_next(agent=agent, queues=["jobs"], limit=10)
    assert [t.id for t in claimed] == [other.id]
    shown = api.get(f"/todos/{waiting.id}/").json()
    assert shown["state"] == "pending" and shown["blocked"] == {"reason": "budget", "root_id": root.id}
    refused = api.post(f"/todos/{waiting.id}/claim/", {})
    assert refused.status_code == 409 and refused.json()["error"]["reason"] == "budget_exhausted"
    # A can-manage agent raises it: the tree is claimable again.
    manager = make_agent("ops", can_manage_queues=True)
    raised = api_for(manager).client.patch(
        f"/api/v1/todos/{root.id}/budget/", data={"budget": {"cost_usd": 5}}, content_type="application/json"
    )
    assert raised.status_code == 200, raised.json()
    assert raised.json()["budget"] == {"cost_usd": 5} and raised.json()["blocked"] is None
    assert api.get(f"/todos/{waiting.id}/").json()["blocked"] is None
    assert [t.id for t in queue.claim_next(agent=agent, queues=["jobs"], limit=10)] == [waiting.id]


def test_only_a_manager_sets_a_budget_and_only_on_a_root(api, api_for, agent, make_agent):
    root = _held(agent, budget={"cost_usd": 1})
    child = _child(agent, root)
    body = {"budget": {"cost_usd": 9}}
    refused = api.client.patch(f"/api/v1/todos/{root.id}/budget/", data=body, content_type="application/json")
    assert refused.status_code == 403
    manager = api_for(make_agent("ops", can_manage_queues=True)).client
    not_root = manager.patch(f"/api/v1/todos/{child.id}/budget/", data=body, content_type="application/json")
    assert not_root.status_code == 409
    zero = manager.patch(
        f"/api/v1/todos/{root.id}/budget/", data={"budget": {"cost_usd": 0}}, content_type="application/json"
    )
    assert zero.status_code == 400 and "budget" in zero.json()["error"]["fields"]
    assert Todo.objects.get(pk=root.id).budget == {"cost_usd": 1}


def test_a_budget_is_a_roots_and_usage_is_named_non_negative_counters(api, agent):
    root = _held(agent)
    child = api.post("/todos/", {"queue": "jobs", "parent": _receipt(root), "budget": {"cost_usd": 1}})
    assert child.status_code == 400 and "budget" in child.json()["error"]["fields"]
    for usage in ({"cost_usd": -1}, {"cost_usd": "1"}, {"bad name!": 1}, {f"c{n}": 1 for n in range(17)}, [1]):
        response = api.post(f"/todos/{root.id}/heartbeat/", {"lease_id": root.lease_id, "usage": usage})
        assert response.status_code == 400, usage
        assert "usage" in response.json()["error"]["fields"]
    assert Todo.objects.get(pk=root.id).usage is None
    with pytest.raises(InvalidTransitionInput):
        queue.heartbeat(root.id, agent=agent, lease_id=str(root.lease_id), usage={"x": float("nan")})


def test_a_tree_keeps_at_most_the_bound_of_counter_names(agent):
    root = _held(agent)
    for n in range(3):
        queue.heartbeat(root.id, agent=agent, lease_id=str(root.lease_id), usage={f"c{n}_{i}": 1 for i in range(16)})
    todo = Todo.objects.get(pk=root.id)
    assert len(todo.usage) == 16 and len(todo.tree_usage) == 16


def test_a_budget_blocks_the_root_itself_when_it_is_claimable_again(agent):
    root = _held(agent, budget={"tokens": 10}, max_attempts=3)
    queue.heartbeat(root.id, agent=agent, lease_id=str(root.lease_id), usage={"tokens": 10})
    queue.release(root.id, agent=agent, lease_id=str(root.lease_id))
    assert Todo.objects.get(pk=root.id).state == TodoState.PENDING
    assert queue.claim_next(agent=agent, queues=["jobs"], limit=1) == []


def test_usage_is_counted_per_queue_and_per_agent_in_metrics(client, agent):
    from prometheus_client import REGISTRY

    def sample(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = sample("switchboard_usage_total", {"queue": "metered", "counter": "tokens_in"})
    by_agent = sample("switchboard_agent_usage_total", {"agent": "alice", "counter": "tokens_in"})
    todo = _held(agent, "metered")
    queue.heartbeat(todo.id, agent=agent, lease_id=str(todo.lease_id), usage={"tokens_in": 5})
    queue.complete(todo.id, agent=agent, lease_id=str(todo.lease_id), usage={"tokens_in": 7})
    assert sample("switchboard_usage_total", {"queue": "metered", "counter": "tokens_in"}) - before == 12
    assert sample("switchboard_agent_usage_total", {"agent": "alice", "counter": "tokens_in"}) - by_agent == 12


def test_the_tree_endpoint_shows_the_trees_usage_and_budget(api, agent):
    root = _held(agent, budget={"cost_usd": 2})
    child = queue.claim(_child(agent, root).id, agent=agent)
    queue.heartbeat(child.id, agent=agent, lease_id=str(child.lease_id), usage={"cost_usd": 0.5})
    for todo_id in (root.id, child.id):
        page = api.get(f"/todos/{todo_id}/tree/").json()
        assert (page["tree_usage"], page["budget"], page["budget_exhausted"]) == (
            {"cost_usd": 0.5},
            {"cost_usd": 2},
            False,
        )


def test_the_dashboard_sums_the_last_hours_usage_per_queue_and_per_agent(admin_client, agent):
    from django.urls import reverse

    for cost in (0.25, 0.5):
        todo = _held(agent, "metered")
        queue.complete(todo.id, agent=agent, lease_id=str(todo.lease_id), usage={"cost_usd": cost, "tokens": 10})
    body = admin_client.ok(reverse("admin-dashboard-json")).json()
    assert body["usage_last_hour"] == {
        "queue": {"metered": {"cost_usd": 0.75, "tokens": 20.0}},
        "agent": {"alice": {"cost_usd": 0.75, "tokens": 20.0}},
    }
    page = admin_client.page(reverse("admin-dashboard"))
    assert "queue metered: cost_usd 0.75, tokens 20" in page, page[page.find("sb-orphans") :][:800]
