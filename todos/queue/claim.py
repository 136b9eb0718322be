"""Claiming: the next todos of the caller's queues (plain, then fair share), or one by id
(todos/sql/claim.py)."""

from __future__ import annotations

from collections.abc import Sequence

from todos import selectors, sql, tracing
from todos.errors import InvalidTransitionInput, QueuesForbidden
from todos.limits import MAX_CLAIM_BATCH
from todos.metrics import count_lapsed_claims, counted
from todos.models import ALL_QUEUES, Agent, Todo, glob_to_like
from todos.queue._common import lease_for, one, owner
from todos.rows import fetch_todos


@counted("claim_next", lambda todos: "ok" if todos else "empty")
@tracing.traced("claim")
def claim_next(
    *,
    agent: Agent,
    queues: Sequence[str] | None = None,
    limit: int = 1,
    lease_seconds: float | None = None,
    worker: str | None = None,
) -> list[Todo]:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, up to ``limit`` todos, by priority
    (lower first), then run_at.

    ``queues`` (names or globs) narrows the agent's claim scopes; it never widens them.
    """
    if not 1 <= limit <= MAX_CLAIM_BATCH:
        raise InvalidTransitionInput(f"limit must be between 1 and {MAX_CLAIM_BATCH}.", field="limit")
    if queues and (outside := agent.outside_claim_scopes(queues)):
        raise QueuesForbidden(outside)
    params = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [glob_to_like(q) for q in queues] if queues else ALL_QUEUES,
        "agent": agent.name,
        "owner": owner(agent, worker),
        "limit": limit,
        "lease_seconds": lease_for(lease_seconds),
    }
    todos = fetch_todos(sql.CLAIM_NEXT, params)
    if todos and todos[0].id is None and todos[0].kind == "limited":  # a limited queue is (issue 32)
        todos = fetch_todos(sql.CLAIM_NEXT_LIMITED, params)
    if todos and todos[0].id is None:  # a keyed queue is among the caller's: it took nothing (fair share)
        todos = fetch_todos(sql.CLAIM_NEXT_FAIR, params)
    todos.sort(key=lambda t: (t.priority, t.run_at))  # UPDATE ... RETURNING keeps no order (CLAIM_ORDER)
    count_lapsed_claims(todos)
    selectors.attach_dependencies(todos)  # a merge step reads its dependencies' results from its claim
    selectors.show_awaited(todos)
    return todos


@counted("claim")
@tracing.traced("claim")
def claim(todo_id: str, *, agent: Agent, lease_seconds: float | None = None, worker: str | None = None) -> Todo:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, for this one todo."""
    rows = fetch_todos(
        sql.CLAIM_ONE,
        {
            "id": todo_id,
            "scopes": agent.claim_like_patterns(),
            "agent": agent.name,
            "owner": owner(agent, worker),
            "limit": 1,
            "lease_seconds": lease_for(lease_seconds),
        },
    )
    count_lapsed_claims(rows)
    selectors.attach_dependencies(rows)
    selectors.show_awaited(rows)
    return one(rows, todo_id, agent, "claim")
