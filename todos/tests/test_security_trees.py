"""Agent trees' new doors (issue 30, items 3-6) against a compromised agent token: another tenant's explain,
usage on a foreign receipt, negative or unbounded usage, a cascade reaching across scopes, a late result under
someone else's receipt, and a budget raised by an agent that may not manage."""

from __future__ import annotations

from typing import Any

import pytest

from todos import queue
from todos.models import Agent, Todo, TodoState
from todos.tests.mcp_live import mcp_base
from todos.tests.test_mcp_tools import error, run

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db


def _held(agent: Agent, queue_name: str, **create: Any) -> Todo:
    todo, _ = queue.create(queue=queue_name, **create)
    return queue.claim(todo.id, agent=agent)


def test_another_tenants_explain_is_404_like_an_absent_todo(make_agent, api_for):
    theirs, _ = queue.create(queue="billing")
    attacker = api_for(make_agent("mallory", claim=["sandbox"]))
    assert attacker.get(f"/todos/{theirs.id}/explain/").status_code == 404
    assert attacker.get("/todos/td_00000000000000000000000000000000/explain/").status_code == 404
    # The agent's own explain lists only queues of its own scopes, whatever it asks for.
    body = attacker.get("/agents/me/explain/", queues="billing,*").json()
    assert [q["queue"] for q in body["queues"]] == [] and body["outside_scopes"] == ["billing"]


def test_usage_on_a_foreign_receipt_adds_nothing(make_agent, api_for):
    owner = make_agent("owner", claim=["jobs"])
    root = _held(owner, "jobs", budget={"cost_usd": 10})
    attacker = api_for(make_agent("mallory", claim=["jobs"]))
    response = attacker.post(f"/todos/{root.id}/heartbeat/", {"lease_id": root.lease_id, "usage": {"cost_usd": 9}})
    assert response.status_code == 409
    completed = attacker.post(f"/todos/{root.id}/complete/", {"lease_id": root.lease_id, "usage": {"cost_usd": 9}})
    assert completed.status_code == 409
    fresh = Todo.objects.get(pk=root.id)
    assert fresh.usage is None and fresh.tree_usage is None and fresh.state == TodoState.CLAIMED


def test_negative_non_numeric_or_unbounded_usage_is_400_naming_usage_and_changes_nothing(api, agent):
    root = _held(agent, "jobs")
    for usage in (
        {"cost_usd": -0.01},
        {"cost_usd": True},
        {"cost_usd": 1e300},
        {"x" * 65: 1},
        {"a\x00b": 1},
        {f"c{n}": 1 for n in range(17)},
        "lots",
    ):
        for door in ("heartbeat", "complete"):
            response = api.post(f"/todos/{root.id}/{door}/", {"lease_id": root.lease_id, "usage": usage})
            assert response.status_code == 400, (door, usage)
            assert "usage" in response.json()["error"]["fields"]
    fresh = Todo.objects.get(pk=root.id)
    assert fresh.usage is None and fresh.state == TodoState.CLAIMED


def test_a_cascade_never_reaches_across_the_cancellers_scopes(make_agent, api_for):
    spawner = make_agent("spawner", claim=["jobs", "billing"])
    root = _held(spawner, "jobs")
    mine, _ = queue.create(queue="jobs", agent=spawner, parent={"id": root.id, "lease_id": str(root.lease_id)})
    theirs, _ = queue.create(queue="billing", agent=spawner, parent={"id": root.id, "lease_id": str(root.lease_id)})
    canceller = api_for(make_agent("mallory", claim=["jobs"]))
    response = canceller.post(f"/todos/{root.id}/cancel/", {"cascade": True})
    assert response.status_code == 200 and response.json()["cascaded"] == 1
    assert Todo.objects.get(pk=mine.id).state == TodoState.CANCELLED
    assert Todo.objects.get(pk=theirs.id).state == TodoState.PENDING
    assert Todo.objects.get(pk=root.id).cascade is None  # nothing left over for the reaper to widen


def test_a_late_result_needs_the_revoked_receipt_and_its_own_agent(make_agent, api_for):
    owner = make_agent("owner", claim=["jobs"])
    todo = _held(owner, "jobs")
    queue.cancel(todo.id, operator="ops")
    attacker = api_for(make_agent("mallory", claim=["jobs"]))
    response = attacker.post(f"/todos/{todo.id}/complete/", {"lease_id": todo.lease_id, "result": {"forged": 1}})
    assert response.status_code == 409 and response.json()["error"]["late_result_kept"] is False
    assert Todo.objects.get(pk=todo.id).late_result is None
    # The revoked receipt is never shown.
    shown = api_for(owner).get(f"/todos/{todo.id}/").json()
    assert todo.lease_id not in str(shown)


def test_only_a_managing_agent_raises_a_budget_and_never_outside_its_scopes(make_agent, api_for):
    root, _ = queue.create(queue="billing", budget={"cost_usd": 1})
    body = {"budget": {"cost_usd": 1_000_000}}
    worker = api_for(make_agent("worker", claim=["billing"])).client
    refused = worker.patch(f"/api/v1/todos/{root.id}/budget/", data=body, content_type="application/json")
    assert refused.status_code == 403
    outsider = api_for(make_agent("mgr", claim=["sandbox"], can_manage_queues=True)).client
    hidden = outsider.patch(f"/api/v1/todos/{root.id}/budget/", data=body, content_type="application/json")
    assert hidden.status_code == 404
    assert Todo.objects.get(pk=root.id).budget == {"cost_usd": 1}


@pytest.mark.django_db(transaction=True)  # the MCP server is its own process: it sees committed rows
def test_the_mcp_explain_tool_is_scoped_like_rest(mcp_base, make_agent):
    theirs, _ = queue.create(queue="billing")
    attacker = make_agent("mallory", claim=["sandbox"])

    async def scenario(client: Any) -> Any:
        return error(await client.call_tool("explain", {"id": theirs.id}))

    assert run(mcp_base, attacker.token, scenario)["code"] == "not_found"
