"""Waits (issue 20): a claimed todo gives its lease back until todos finish, an event arrives, a token is
used or someone resolves it. todos/waitpoints.py parses what a wait is for; todos/sql/waits.py and
todos/sql/dependencies.py have the statements."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from psycopg.types.json import Jsonb

from todos import sql, tracing, waitpoints
from todos.errors import InvalidTransitionInput, TodoConflict, TodoNotFound
from todos.metrics import TRANSITIONS, counted
from todos.models import Agent, Todo, hash_token, visible_patterns
from todos.queue._common import JSON, one
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
) -> tuple[Todo, str | None]:
    """claimed -> waiting, giving the lease and the attempt back (as release), until what ``wait_for``
    names resolves it or ``timeout_seconds`` pass. Returns the todo and, for a token wait, the token (shown
    this once: only its hash is stored). Needs the current receipt. A wait on todos that have all finished
    resolves at once."""
    spec = waitpoints.parse_for(wait_for, waiter_id=todo_id)
    timeout, on_timeout = waitpoints.check_timeout(timeout_seconds, on_timeout)
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
    }
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


@counted("resolve")
@tracing.traced("resolve")
def resolve_token(token: str, *, data: JSON = None) -> Todo:
    """waiting -> pending, by the token of a ``{"token": true}`` wait; the token is the only credential.
    Resolves once: a second resolve is a conflict, an unknown token not found."""
    digest = hash_token(token)
    rows = fetch_todos(sql.RESOLVE_TOKEN, {"hash": digest, "data": Jsonb(data)})
    if rows:
        return rows[0]
    found = fetchall(sql.WAITPOINT_BY_HASH, {"hash": digest})
    if not found:
        raise TodoNotFound("No waitpoint has this token.")
    state = Todo.objects.filter(pk=found[0][0]).values_list("state", flat=True).first() or "unknown"
    raise TodoConflict("This waitpoint was resolved already (or its todo no longer waits).", state=state)


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
    """waiting -> pending, whatever it waits for: an agent whose scopes cover the queue (``agent``), or an
    operator (``agent`` None, ``verdict`` "approved" or "rejected" with a ``note``). ``by`` names who."""
    detail: dict[str, Any] = {"data": data, "resolved_by": by}
    kind = "agent" if agent is not None else "operator"
    if verdict is not None:
        if verdict not in ("approved", "rejected"):
            raise InvalidTransitionInput("verdict must be 'approved' or 'rejected'.", field="verdict")
        detail.update(verdict=verdict, note=note)
    rows = fetch_todos(
        sql.RESOLVE_MANUAL, {"id": todo_id, "visible": visible_patterns(agent), "by": kind, "detail": Jsonb(detail)}
    )
    return one(rows, todo_id, agent, "resolve")


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
