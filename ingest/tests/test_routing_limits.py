"""A route's named limits (issue 31): the todos it makes name them, and are held by them."""

from __future__ import annotations

from typing import Any

from events.models import Event
from ingest import routing
from todos import flow, queue
from todos.models import Agent


def test_a_route_names_limits_on_the_todos_it_makes_and_they_are_held(
    make_source: Any, make_route: Any, make_agent: Any
) -> None:
    make_route(make_source(), "*", "reviews", limits=["openai"])
    event = Event.objects.create(source="gh", type="pull_request.opened", delivery_id="d1", payload={})
    [routed] = routing.route_event(event, routing.active_routes("gh"))
    assert routed.todo.limits == ["openai"]
    flow.put("openai", max_claimed=0)
    agent: Agent = make_agent("worker")
    assert queue.claim_next(agent=agent, queues=["reviews"]) == []
