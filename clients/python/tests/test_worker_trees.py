"""Agent trees through the worker runtime against the shipped server (issue 30): a three-level tree whose
handlers report usage with ctx.usage, rolled up to the root; a budget spent stops the tree's next level from
being claimed and tells the running handler (ctx.budget_exhausted); the client's explain, set_budget and
cascading cancel."""

from __future__ import annotations

import asyncio
import threading
from decimal import Decimal

import pytest
from switchboard_client import Client, Conflict, Worker

from todos import queue
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_three_level_tree_reports_usage_that_adds_up_on_its_root(server, agent):
    root = queue.create(queue="tree", kind="spawn", payload={"levels": 2})[0]
    client = Client(server.base, agent.token)

    def spawn(todo, ctx):
        ctx.usage(tokens_in=100, cost_usd=0.5)
        if todo.payload["levels"]:
            ctx.create("tree", kind="spawn", payload={"levels": todo.payload["levels"] - 1})
        ctx.usage(tokens_in=1)  # left unsent at return: a last heartbeat carries it before the completion
        return {"depth": todo.depth}

    with client:
        for _ in range(3):
            worker = Worker(client, queues=["tree"], lease_seconds=60, poll_seconds=1, drain=True)
            worker.handler("spawn")(spawn)
            asyncio.run(worker.arun())
        shown = client.get(root.pk)
    tree = list(Todo.objects.filter(pk=root.pk) | Todo.objects.filter(root_id=root.pk))
    assert len(tree) == 3 and {t.state for t in tree} == {TodoState.DONE}
    assert all(t.usage == {"tokens_in": 101, "cost_usd": 0.5} for t in tree)
    assert {k: Decimal(str(v)) for k, v in shown.tree_usage.items()} == {
        "tokens_in": Decimal(303),
        "cost_usd": Decimal("1.5"),
    }


def test_a_spent_budget_tells_the_handler_and_blocks_the_rest_until_raised(server, agent, make_agent):
    root = queue.create(queue="budgeted", kind="spend", budget={"cost_usd": 1})[0]
    client = Client(server.base, agent.token)
    told = threading.Event()

    def spend(todo, ctx):
        if todo.depth == 0:
            ctx.create("budgeted", kind="spend")
            ctx.usage(cost_usd=1, now=True)
            for _ in range(400):  # up to 20 s: a loaded machine
                if ctx.budget_exhausted:
                    told.set()
                    break
                threading.Event().wait(0.05)
        return {}

    with client:
        worker = Worker(client, queues=["budgeted"], lease_seconds=3, poll_seconds=1, drain=True)
        worker.handler("spend")(spend)
        asyncio.run(worker.arun())
        assert told.is_set()
        child = Todo.objects.get(root_id=root.pk)
        assert child.state == TodoState.PENDING
        explained = client.explain(child.pk)
        assert not explained.claimable and [r["reason"] for r in explained.reasons] == ["budget"]
        manager = Client(server.base, make_agent("ops", can_manage_queues=True).token)
        with manager:
            assert manager.set_budget(root.pk, {"cost_usd": 2}).budget == {"cost_usd": 2}
        assert client.explain(child.pk).claimable


def test_the_client_cancels_a_tree_and_a_late_complete_is_kept(server, agent):
    client = Client(server.base, agent.token)
    with client:
        root = client.claim_one(client.create("cascade"))
        child = client.claim_one(client.create("cascade", parent=root))
        client.cancel(root, cascade=True)
        with pytest.raises(Conflict) as refused:
            client.complete(child, result={"late": True})
        assert refused.value.state == "cancelled"
        assert client.get(child.id).late_result["result"] == {"late": True}
