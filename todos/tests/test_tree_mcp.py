"""Agent trees through MCP (issue 30): a three-level tree made with create_for under held leases, usage
reported on heartbeat and complete rolled up to the root, heartbeat's budget_exhausted, and the explain tool."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from todos.models import Todo
from todos.tests.mcp_live import mcp_base
from todos.tests.test_mcp_tools import ok, run

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)  # the MCP server is its own process


def test_a_three_level_tree_over_mcp_with_usage_budget_and_explain(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        async def held(args: dict[str, Any]) -> dict[str, Any]:
            made = ok(await client.call_tool("create_for", args))["todo"]
            return ok(await client.call_tool("claim", {"id": made["id"]}))["todo"]

        root = await held({"queue": "mcp-tree", "title": "root", "budget": {"cost_usd": 1}})
        child = await held({"queue": "mcp-tree", "parent": {"id": root["id"], "lease_id": root["lease_id"]}})
        leaf = ok(
            await client.call_tool(
                "create_for", {"queue": "mcp-tree", "parent": {"id": child["id"], "lease_id": child["lease_id"]}}
            )
        )["todo"]
        beat = ok(
            await client.call_tool(
                "heartbeat", {"id": child["id"], "lease_id": child["lease_id"], "usage": {"cost_usd": 0.5}}
            )
        )
        done = ok(
            await client.call_tool(
                "complete",
                {"id": child["id"], "lease_id": child["lease_id"], "result": {}, "usage": {"cost_usd": 0.5}},
            )
        )
        spent = ok(await client.call_tool("heartbeat", {"id": root["id"], "lease_id": root["lease_id"]}))
        explained = ok(await client.call_tool("explain", {"id": leaf["id"]}))
        mine = ok(await client.call_tool("explain", {"queues": ["mcp-tree"]}))
        return root, leaf, beat, done, spent, explained, mine

    root, leaf, beat, done, spent, explained, mine = run(mcp_base, agent.token, scenario)
    assert (leaf["depth"], leaf["root_id"]) == (2, root["id"])
    assert beat["budget_exhausted"] is False and done["todo"]["usage"] == {"cost_usd": 1.0}
    assert spent["budget_exhausted"] is True
    assert explained["claimable"] is False and [r["reason"] for r in explained["reasons"]] == ["budget"]
    assert mine["queues"][0]["queue"] == "mcp-tree" and mine["queues"][0]["claimable"] is False
    usage = Todo.objects.get(pk=root["id"]).tree_usage
    assert Decimal(str(usage["cost_usd"])) == 1
