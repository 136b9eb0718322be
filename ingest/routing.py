"""From a stored event to its todos: match routes on the event type, render titles, create through the
queue's one door (todos/queue/) with the idempotency key ``ingest:<delivery_id>:<route id>`` (a
prefix agents may not use: todos/models.py, SYSTEM_KEY_PREFIXES).

Running the routes twice for one event is safe by construction: a todo that can still run holds its
key, so a second run returns it (created=False); a done or dead-lettered one has freed its key, so a
replay makes a fresh todo.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from events.models import Event
from ingest.errors import RoutingFailed
from ingest.models import Route
from todos import queue
from todos.errors import QueueError
from todos.limits import MAX_FAIR_KEY_CHARS
from todos.models import Agent, Todo

TITLE_MAX_LENGTH = 500  # Todo.title's column

# {{ and }} are literal braces; {a.b.0} is a dotted path of keys (or list indexes). Anything else in
# braces (a format spec, a conversion, an attribute access) is not a placeholder and stays as text.
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _lookup(payload: Any, path: str) -> Any:
    """Walk dict keys (and list indexes); None when any step is missing. Item access only: a path
    can never reach an attribute, a method or anything that is not JSON data."""
    value = payload
    for part in path.split("."):
        if isinstance(value, dict):
            if part not in value:
                return None
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value[:TITLE_MAX_LENGTH]
    if isinstance(value, int | float):
        return str(value)
    # An object or a list: compact JSON, cut to what a title can hold.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)[:TITLE_MAX_LENGTH]


def render_title(template: str, payload: Any, *, max_length: int = TITLE_MAX_LENGTH) -> str:
    """Fill ``{dotted.path}`` placeholders from the payload. Not str.format and not a template engine:
    a path is data lookup only, so a sender's payload cannot run anything. Control characters become
    spaces (a title is one line) and the result is cut to ``max_length``."""

    def replace(match: re.Match[str]) -> str:
        text = match.group(0)
        if text == "{{":
            return "{"
        if text == "}}":
            return "}"
        return _as_text(_lookup(payload, match.group(1)))

    rendered = _PLACEHOLDER.sub(replace, template)
    return _CONTROL.sub(" ", rendered).strip()[:max_length]


def route_key(delivery_id: str, route_id: int) -> str:
    """A route todo's idempotency key. The ``ingest:`` prefix is refused from agents: without it an agent
    could create ``<delivery>:<route>`` before a predictable delivery came, and the delivery would find
    that todo (created=False) instead of making its own."""
    return f"ingest:{delivery_id}:{route_id}"


@dataclass(frozen=True)
class Routed:
    todo: Todo
    created: bool
    route_id: int


def active_routes(source_slug: str) -> list[Route]:
    return list(Route.objects.filter(source__slug=source_slug, is_active=True).order_by("id"))


def route_event(event: Event, routes: Iterable[Route], *, traceparent: str | None = None) -> list[Routed]:
    """One todo per matching route (existing runnable todos are returned, not duplicated), each in the
    delivery's trace. Call inside the caller's transaction: a route that cannot make its todo raises
    RoutingFailed, and the caller rolls the whole delivery back."""
    routed = []
    for route in routes:
        if not route.matches(event.type):
            continue
        try:
            todo, created = queue.create(
                queue=route.queue,
                agent=None,  # the system: routes are configured by operators
                kind=route.kind,
                title=render_title(route.title_template, event.payload),
                payload=event.payload,
                source=event.source,
                idempotency_key=route_key(event.delivery_id, route.id),
                assignee=route.assignee or None,
                max_attempts=route.max_attempts,
                event_id=event.id,
                delay_seconds=route.delay_seconds or None,
                priority=route.priority,
                fair_key=render_title(route.fair_key_template, event.payload, max_length=MAX_FAIR_KEY_CHARS),
                limits=route.limits or None,
                traceparent=traceparent,
            )
        except QueueError as exc:
            raise RoutingFailed(f"Route {route.id} could not make its todo: {exc.detail}") from exc
        routed.append(Routed(todo=todo, created=created, route_id=route.id))
    return routed


def replay(event: Event, *, agent: Agent | None = None) -> list[Routed]:
    """Re-run today's routes for a stored event, in one transaction (all its todos or none). An agent
    replays only the routes whose queue is in its create scopes (it is creating those todos); staff and
    the system (agent None, e.g. an admin action) replay all of them."""
    routes = active_routes(event.source)
    if agent is not None:
        routes = [r for r in routes if agent.may_create_in(r.queue)]
    with transaction.atomic():
        return route_event(event, routes)


class IngestRouter:
    """ingest's side of the events seam (events/router.py) and of the event waits' seam
    (todos/event_sources.py), registered in IngestConfig.ready()."""

    def replay(self, event: Event, *, agent: Agent | None = None) -> list[Routed]:
        return replay(event, agent=agent)

    def visible_sources(self, agent: Agent) -> QuerySet[Route, Any]:
        # Every route, active or not, so an agent keeps seeing the history of a route switched off.
        return Route.objects.filter(queue__like_any=agent.visible_like_patterns()).values("source__slug")

    def visible_to(self, agent: Agent, slug: str) -> bool:
        """todos' side (todos/event_sources.py): may this agent wait on events of ``slug``? The same rule
        as visible_sources, for one source: a route of it (active or not) into the agent's scopes."""
        return Route.objects.filter(source__slug=slug, queue__like_any=agent.visible_like_patterns()).exists()
