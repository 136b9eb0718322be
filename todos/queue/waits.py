"""Waits (issue 20): a claimed todo gives its lease back until todos finish, an event arrives, a token is
used or someone resolves it. todos/waitpoints.py parses what a wait is for; todos/sql/waits.py and
todos/sql/dependencies.py have the statements."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from psycopg.types.json import Jsonb

from todos import event_sources, limits, sql, tracing, waitpoints
from todos.errors import InvalidTransitionInput, NotAResolver, TodoConflict, TodoNotFound, TooManyWaits, WaitpointUsed
from todos.metrics import TRANSITIONS, counted
from todos.models import Agent, Todo, TodoState, Waitpoint, hash_token, visible_patterns
from todos.queue import people
from todos.queue._common import JSON, miss
from todos.queue.lease import with_receipt
from todos.rows import fetch_todos, fetchall


@counted("wait")
@tracing.traced("wait")
def wait(
    todo_id: str,
    *,
    agent: Agent,
    lease_id: str,
    wait_for: Any,
    timeout_seconds: Any,
    on_timeout: Any = "pending",
    resolvers: Any = None,
) -> tuple[Todo, str | None]:
    """claimed -> waiting, giving the lease and the attempt back (as release), until what ``wait_for``
    names resolves it or ``timeout_seconds`` pass. Returns the todo and, for a token wait, the token (shown
    this once: only its hash is stored). Needs the current receipt. A wait on todos that have all finished
    resolves at once. ``resolvers``: who besides the token and operators may resolve it
    (todos/waitpoints.py); never the waiting agent. A wait for people (issue 29) is decided by the people
    it names (todos/queue/people.py), never by an agent, and names no resolvers. An event wait names a
    source the agent can see (else 404 as for an unknown source), within MAX_OPEN_EVENT_WAITS_PER_AGENT (429)."""
    spec = waitpoints.parse_for(wait_for, waiter_id=todo_id)
    timeout, on_timeout = waitpoints.check_timeout(timeout_seconds, on_timeout)
    named = waitpoints.parse_resolvers(resolvers)
    if spec.kind == "people" and (named.agents or named.scope_likes):
        why = "A wait for people is decided by people; it names no resolvers."
        raise InvalidTransitionInput(why, field="resolvers")
    token = waitpoints.new_token() if spec.kind == "token" else None
    params = {
        "waiting_for": Jsonb(spec.shown),
        "timeout": timeout,
        "on_timeout": on_timeout,
        "hash": hash_token(token) if token else None,
        "source": spec.source,
        "type_like": spec.type_like,
        "match": Jsonb(spec.match) if spec.match is not None else None,
        "key": spec.key,
        "awaited": len(spec.todo_ids),
        "unlink": spec.kind != "todos",
        "resolver_agents": named.agents,
        "resolver_scopes": named.scope_likes,
        "people": None,
        "decider_users": [],
        "decider_groups": [],
        "escalate_groups": [],
        "remind_after": None,
        "escalate_after": None,
    }
    if spec.people is not None:
        return people.wait_for_people(todo_id, agent=agent, lease_id=lease_id, asked=spec.people, params=params), None
    if spec.kind == "event":
        return _wait_for_event(todo_id, agent, lease_id, spec.source or "", params), None
    if spec.kind != "todos":
        return with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params), token
    # A wait on todos: its edges as a create's dependencies (todos/sql/dependencies.py), settled by the same
    # function; those already finished are settled once the todo waits (the last one resolves it at once).
    with transaction.atomic():
        found = dict(fetchall(sql.LINK_WAIT, {"id": todo_id, "ids": spec.todo_ids, "visible": visible_patterns(agent)}))
        if missing := [i for i in spec.todo_ids if i not in found]:
            raise TodoNotFound(f"No todo {missing[0]} (named in for.todos).")
        todo = with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params)
        finished = [(i, outcome) for i, outcome in found.items() if outcome is not None]
        if not finished:
            return todo, None
        fetchall(sql.SETTLE, {"ids": [i for i, _ in finished], "outcomes": [o for _, o in finished]})
        return fetch_todos(sql.TODOS_BY_ID, {"ids": [todo.id]})[0], None


def _wait_for_event(todo_id: str, agent: Agent, lease_id: str, source: str, params: dict[str, Any]) -> Todo:
    """An event wait, in one short transaction: the source must be one the agent may see events of (the rule
    of GET /api/v1/events/, asked through todos/event_sources.py), and the agent's open event waits must be
    below the cap. The transaction-scoped advisory lock on the agent's name makes its count and its insert
    one step, so concurrent waits of one agent cannot pass the cap together."""
    if not event_sources.visible_to(agent, source):
        # The same answer for a source that does not exist: slugs do not leak.
        raise TodoNotFound(f"No event source {source[:100]!r}.", fields={"for.event.source": ["No such source."]})
    cap = limits.max_open_event_waits_per_agent()
    with transaction.atomic():
        fetchall(sql.AGENT_LOCK, {"key": f"event-waits:{agent.name}"})
        ((open_waits,),) = fetchall(sql.OPEN_EVENT_WAITS, {"agent": agent.name, "cap": cap})
        if open_waits >= cap:
            raise TooManyWaits(
                f"This agent already has {cap} open event waits (MAX_OPEN_EVENT_WAITS_PER_AGENT).",
                limit="MAX_OPEN_EVENT_WAITS_PER_AGENT",
                max=cap,
            )
        return with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params)


@counted("resolve")
@tracing.traced("resolve")
def resolve_token(token: str, *, data: JSON = None) -> Todo:
    """waiting -> pending, by the token of a ``{"token": true}`` wait; the token is the only credential.
    Resolves once: a second resolve is a conflict, an unknown token not found."""
    digest = hash_token(token)
    rows = fetch_todos(sql.RESOLVE_TOKEN, {"hash": digest, "data": Jsonb(data)})
    if rows:
        return rows[0]
    if not fetchall(sql.WAITPOINT_BY_HASH, {"hash": digest}):
        raise TodoNotFound("No waitpoint has this token.")
    # Without the todo's state: the token is the holder's only credential, and it is spent.
    raise WaitpointUsed("This waitpoint was resolved already (or its todo no longer waits).")


@counted("resolve")
@tracing.traced("resolve")
def resolve(
    todo_id: str,
    *,
    by: str,
    data: JSON = None,
    agent: Agent | None = None,
    verdict: str | None = None,
    note: str = "",
) -> Todo:
    """waiting -> pending, whatever it waits for, by someone the wait allows (issue 28): an operator
    (``agent`` None: an admin action, with ``verdict`` "approved" or "rejected" and a ``note``; or an agent
    with ``can_retry_dead_letters``, which staff get from Django's todos.change_todo), or an agent the wait
    names in its resolvers; never the agent that waits, and no other agent when it names none. ``by`` names
    who, and the resolution records it. Refused: NotAResolver (403), nothing changed."""
    detail: dict[str, Any] = {"data": data, "resolved_by": by}
    operator = agent is None or agent.can_retry_dead_letters
    if verdict is not None:
        if verdict not in ("approved", "rejected"):
            raise InvalidTransitionInput("verdict must be 'approved' or 'rejected'.", field="verdict")
        detail.update(verdict=verdict, note=note)
    rows = fetch_todos(
        sql.RESOLVE_MANUAL,
        {
            "id": todo_id,
            "visible": visible_patterns(agent),
            "by": "operator" if operator else "agent",
            "detail": Jsonb(detail),
            "agent": agent.name if agent is not None else None,
            "operator": operator,
            "claim_scopes": list(agent.claim_scopes) if agent is not None else [],
        },
    )
    if rows:
        return rows[0]
    refused = miss(todo_id, agent, "resolve")
    if isinstance(refused, TodoConflict) and refused.state == TodoState.WAITING and _has_open_wait(todo_id):
        if Waitpoint.objects.filter(todo_id=todo_id, people__isnull=False).exists():
            raise NotAResolver(f"A person decides this wait, on /decide/{todo_id}/; no agent may resolve it.")
        raise NotAResolver("Only an operator or an agent this wait names in its resolvers may resolve it.")
    raise refused


def _has_open_wait(todo_id: str) -> bool:
    return Waitpoint.objects.filter(todo_id=todo_id, resolved_at__isnull=True).exists()


@tracing.traced("resolve")
def resolve_events(*, event_id: str, source: str, event_type: str, payload: JSON, received_at: datetime) -> list[Todo]:
    """waiting -> pending for every open wait this stored event matches (called in the transaction that
    stores it, so a redelivery, which stores nothing, resolves nothing). Index lookups, one per scalar
    leaf of the payload (todos/waitpoints.py), never a scan of the waits."""
    todos = fetch_todos(
        sql.RESOLVE_EVENTS,
        {
            "keys": waitpoints.delivery_keys(source, payload),
            "source": source,
            "type": event_type,
            "payload": Jsonb(payload),
            "received_at": received_at,
            "event_id": event_id,
        },
    )
    if todos:
        TRANSITIONS.labels(verb="resolve", outcome="ok").inc(len(todos))
    return todos
