"""What every door of the queue service shares: who the caller is in SQL terms, and how a guarded statement
that touched nothing becomes the caller's error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from todos import sql
from todos.errors import TodoConflict, TodoNotFound, TodoSuperseded
from todos.models import Agent, Todo, TodoState, visible_patterns
from todos.states import PRIORITY_MAX, PRIORITY_MIN

# The reason a create with supersede cancels the todo it replaces with (issue 31, todos/sql/flow.py SUPERSEDE).
SUPERSEDED = "superseded"

JSON = Any


def priority_problem(priority: Any) -> str | None:
    """Why ``priority`` is refused, or None: the one priority rule of create and set_priority."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        return f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX} (lower runs first)."
    return None


def owner(agent: Agent, worker: str | None) -> str:
    return f"{agent.name}/{worker}" if worker else agent.name


def lease_for(seconds: float | None) -> float:
    return float(seconds if seconds is not None else settings.QUEUE_DEFAULT_LEASE_SECONDS)


@dataclass(frozen=True)
class _ClosedQueue:
    """A door that a closed queue (paused, or at its limit) can refuse while the todo itself is fine."""

    reason: str
    detail: str  # with {id}


# Why a claim of a pending todo, or a heartbeat with the current receipt of a lapsed lease (sql.HEARTBEAT
# refuses to take the lease back then), touched nothing: by door, then by whether the queue is paused.
_CLOSED_QUEUE = {
    ("claim", True): _ClosedQueue("queue_paused", "Cannot claim {id} now: its queue is paused."),
    ("claim", False): _ClosedQueue(
        "queue_limit", "Cannot claim {id} now: its queue is at its concurrency or rate limit."
    ),
    ("heartbeat", True): _ClosedQueue(
        "queue_paused", "Cannot heartbeat {id}: its lease lapsed and its queue is paused, so it cannot be taken back."
    ),
    ("heartbeat", False): _ClosedQueue(
        "queue_limit",
        "Cannot heartbeat {id}: its lease lapsed and its queue is at its max_claimed, so it cannot be taken back.",
    ),
}


def miss(todo_id: str, agent: Agent | None, action: str, lease_id: str | None = None) -> Exception:
    """Classify a guarded statement that touched nothing, by a read of the todo as the caller sees it."""
    with connection.cursor() as cursor:
        cursor.execute(sql.CURRENT_STATE, {"id": todo_id, "visible": visible_patterns(agent)})
        row = cursor.fetchone()
    if row is None:
        return TodoNotFound(f"No todo {todo_id}.")
    state, dead, current_lease, owner_agent, paused, limited, budget_spent, last_reason = row
    if state == TodoState.CANCELLED and last_reason == SUPERSEDED:
        # A create with supersede replaced it (issue 31): 409 superseded.
        return TodoSuperseded(f"Cannot {action} {todo_id}: a newer todo superseded it.", state=state, dead_letter=False)
    if state == TodoState.CANCELLED:
        # A cancel revoked the lease: the worker learns here that it should stop.
        return TodoConflict(f"Cannot {action} {todo_id}: it was cancelled.", state=state, dead_letter=False)
    holds_receipt = lease_id == current_lease and (agent is None or owner_agent == agent.name)
    closed_queue = (action == "claim" and state == TodoState.PENDING and (paused or limited)) or (
        action == "heartbeat" and holds_receipt and state in (TodoState.PENDING, TodoState.CLAIMED)
    )
    if closed_queue:
        why = _CLOSED_QUEUE[action, bool(paused)]
        return TodoConflict(why.detail.format(id=todo_id), state=state, dead_letter=dead, reason=why.reason)
    if action == "claim" and budget_spent:
        return TodoConflict(
            f"Cannot claim {todo_id} now: its tree has spent its budget (an operator raises it).",
            state=state,
            dead_letter=dead,
            reason="budget_exhausted",
        )
    if lease_id is not None and not holds_receipt:
        return TodoConflict(
            f"Cannot {action} {todo_id}: the lease_id is not the current receipt (the lease lapsed and the todo "
            "was claimed again, or it was already finished, failed or released).",
            state=state,
            dead_letter=dead,
        )
    return TodoConflict(f"Cannot {action} {todo_id} while it is {state}.", state=state, dead_letter=dead)


def one(rows: list[Todo], todo_id: str, agent: Agent | None, action: str, lease_id: str | None = None) -> Todo:
    """The todo a single-todo door changed, or the error that says why its statement changed nothing."""
    if rows:
        return rows[0]
    raise miss(todo_id, agent, action, lease_id)
