"""Attacks on named limits (issue 31), each agent token assumed compromised: setting or removing a limit
without --can-manage, and limit names as data, bounded (never a pattern, never SQL text)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from todos import flow, queue
from todos.errors import TodoConflict
from todos.limits import MAX_LIMITS_NAMED
from todos.models import Agent, Limit, Todo
from todos.tests.mcp_live import mcp_base

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db


def _put(api: Any, name: str, body: Any) -> Any:
    return api.client.put(f"/api/v1/limits/{name}/", data=json.dumps(body), content_type="application/json")


def test_an_agent_without_can_manage_cannot_set_raise_or_remove_a_limit(api: Any) -> None:
    flow.put("openai", max_claimed=2)
    assert _put(api, "openai", {"max_claimed": 1_000_000}).status_code == 403
    assert _put(api, "fresh", {}).status_code == 403
    assert api.client.delete("/api/v1/limits/openai/").status_code == 403
    assert Limit.objects.get(name="openai").max_claimed == 2
    assert not Limit.objects.filter(name="fresh").exists()
    shown = api.get("/limits/openai/")
    assert shown.status_code == 200 and shown.json()["max_claimed"] == 2, "reading it is fine: no secret in it"


def test_an_agent_without_can_manage_cannot_name_limits_on_a_queue(api: Any) -> None:
    api.post("/todos/", {"queue": "default"})
    response = api.client.patch(
        "/api/v1/queues/default/", data=json.dumps({"limits": ["openai"]}), content_type="application/json"
    )
    assert response.status_code == 403


@pytest.mark.parametrize("name", ["%", "_", "op*", "a'); DROP TABLE todos_limit; --", "x" * 101, "é"])
def test_limit_names_are_data_a_pattern_or_sql_is_refused_not_matched(api: Any, name: str) -> None:
    flow.put("openai", max_claimed=0)  # lets nothing through: a name matching it as a pattern would be held
    response = api.post("/todos/", {"queue": "default", "limits": [name]})
    assert response.status_code == 400, response.content
    assert "limits" in response.json()["error"]["fields"]
    assert not Todo.objects.exists()
    assert Limit.objects.count() == 1


def test_a_todo_names_a_bounded_number_of_limits(api: Any) -> None:
    names = [f"l{i}" for i in range(MAX_LIMITS_NAMED + 1)]
    response = api.post("/todos/", {"queue": "default", "limits": names})
    assert response.status_code == 400
    assert "limits" in response.json()["error"]["fields"]
    batch = api.post("/todos/batch/", {"todos": [{"queue": "default", "limits": names}]})
    assert batch.status_code == 400
    assert not Todo.objects.exists()


def test_naming_a_limit_never_escapes_it_a_todo_held_at_zero_is_never_claimed(agent: Agent) -> None:
    flow.put("shut", max_claimed=0)
    todo, _ = queue.create(queue="default", limits=["shut"])
    assert queue.claim_next(agent=agent, limit=10) == []
    with pytest.raises(TodoConflict):
        queue.claim(todo.id, agent=agent)
    assert Todo.objects.get(pk=todo.id).state == "pending"


def test_a_holder_cannot_park_a_limit_its_todo_does_not_name(api: Any) -> None:
    """A compromised worker could otherwise stop a whole fleet: parking is only for a limit its own todo (or
    its queue) names. 400 naming ``park``; the todo stays claimed, no limit row is made or changed."""
    flow.put("openai", max_claimed=5)
    api.post("/todos/", {"queue": "default", "limits": ["github"]})
    [held] = api.post("/todos/claim/", {}).json()["todos"]
    park = {"limit": "openai", "until": (timezone.now() + timedelta(hours=1)).isoformat()}
    for verb in ("fail", "release"):
        response = api.post(f"/todos/{held['id']}/{verb}/", {"lease_id": held["lease_id"], "park": park})
        assert response.status_code == 400, response.content
        assert "park" in response.json()["error"]["fields"]
    assert Todo.objects.get(pk=held["id"]).state == "claimed"
    assert Limit.objects.get(name="openai").parked_until is None
    assert not Limit.objects.filter(name="github").exists()


def test_parking_needs_the_current_receipt(api: Any, make_agent: Any, api_for: Any) -> None:
    api.post("/todos/", {"queue": "default", "limits": ["openai"]})
    [held] = api.post("/todos/claim/", {}).json()["todos"]
    other = api_for(make_agent("mallory"))
    park = {"limit": "openai", "until": (timezone.now() + timedelta(hours=1)).isoformat()}
    response = other.post(f"/todos/{held['id']}/release/", {"lease_id": held["lease_id"], "park": park})
    assert response.status_code in (404, 409)
    response = api.post(f"/todos/{held['id']}/release/", {"lease_id": "ls_" + "0" * 32, "park": park})
    assert response.status_code == 409
    assert not Limit.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_limit_names_over_mcp_create_for_are_data_as_over_rest(mcp_base: str, agent: Agent) -> None:
    """create_for takes ``limits`` (issue 31's leftover): the same field as POST /todos/, so a pattern or SQL text
    is invalid there too, naming the field, and nothing is created; a real name holds the todo."""
    from todos.tests.test_mcp_tools import error, ok, run

    async def scenario(client: Any) -> list[Any]:
        return [
            error(await client.call_tool("create_for", {"queue": "jobs", "limits": ["op%"]})),
            error(
                await client.call_tool("create_for", {"queue": "jobs", "limits": ["a'); DROP TABLE todos_limit; --"]})
            ),
            ok(await client.call_tool("create_for", {"queue": "jobs", "limits": ["openai"]})),
        ]

    *refused, made = run(mcp_base, agent.token, scenario)
    assert all("limits" in json.dumps(r) for r in refused), refused
    assert [t.limits for t in Todo.objects.all()] == [["openai"]]
    assert made["todo"]["limits"] == ["openai"]
