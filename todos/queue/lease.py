"""The lease holder's doors: heartbeat, complete (one or a batch), fail and release, each needing the
current receipt (todos/sql/lease.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from psycopg.types.json import Jsonb

from todos import sql, states, tracing
from todos.errors import InvalidTransitionInput, TodoConflict, TodoNotFound
from todos.limits import MAX_COMPLETE_BATCH
from todos.metrics import TRANSITIONS, count_usage, counted
from todos.models import Agent, Todo, TodoState, visible_patterns
from todos.queue import trees
from todos.queue._common import JSON, lease_for, miss, one
from todos.rows import fetch_todos, fetch_todos_reviving
from todos.usage import budget_exhausted


def with_receipt(statement: str, action: str, todo_id: str, agent: Agent, lease_id: str, **params: Any) -> Todo:
    rows = fetch_todos_reviving(
        statement,
        {"id": todo_id, "lease_id": lease_id, "agent": agent.name, "visible": visible_patterns(agent), **params},
        action,
        todo_id,
    )
    return one(rows, todo_id, agent, action, lease_id)


@counted("heartbeat")
@tracing.traced("heartbeat")
def heartbeat(
    todo_id: str,
    *,
    agent: Agent,
    lease_id: str,
    lease_seconds: float | None = None,
    progress: JSON = None,
    checkpoint: JSON = None,
    usage: JSON = None,
) -> Todo:
    """claimed -> claimed with lease_expires_at = now() + lease. Needs the current receipt. ``progress`` and
    ``checkpoint``, when given, replace the todo's (the checkpoint is handed to whoever claims it next).
    ``usage`` ({counter: number}) is added to the todo's and its tree's (todos/queue/trees.py). The todo
    answered carries ``budget_exhausted``: its tree has spent its budget, so the worker should stop."""
    reported = trees.usage_param(usage)
    todo = with_receipt(
        sql.HEARTBEAT if reported is None else sql.HEARTBEAT_USAGE,
        "heartbeat",
        todo_id,
        agent,
        lease_id,
        lease_seconds=lease_for(lease_seconds),
        progress=Jsonb(progress) if progress is not None else None,
        checkpoint=Jsonb(checkpoint) if checkpoint is not None else None,
        usage=reported,
    )
    if usage:
        count_usage(todo.queue, agent.name, usage)
    todo.tree_budget_exhausted = budget_exhausted(todo)  # type: ignore[attr-defined]
    return todo


@counted("complete")
@tracing.traced("complete")
def complete(todo_id: str, *, agent: Agent, lease_id: str, result: JSON = None, usage: JSON = None) -> Todo:
    """claimed -> done, adding ``usage`` to the todo's and its tree's. Needs the current receipt. A todo that
    was cancelled (alone or by a cascade) while this receipt held it keeps ``result`` as its late_result, a
    tombstone, and the answer is 409 cancelled."""
    usage_value = trees.usage_param(usage)
    try:
        todo = with_receipt(
            sql.COMPLETE if usage_value is None else sql.COMPLETE_USAGE,
            "complete",
            todo_id,
            agent,
            lease_id,
            result=Jsonb(result) if result is not None else None,
            usage=usage_value,
        )
        if usage:
            count_usage(todo.queue, agent.name, usage)
        return todo
    except TodoConflict as conflict:
        if conflict.state != TodoState.CANCELLED or conflict.code != TodoConflict.code:
            raise  # not a cancel (a supersede says so itself, issue 31)
        kept = trees.keep_late_result(todo_id, agent=agent, lease_id=lease_id, result=result)
        raise TodoConflict(
            f"Cannot complete {todo_id}: it was cancelled."
            + (" Its result is kept as late_result, not applied." if kept else ""),
            state=TodoState.CANCELLED,
            dead_letter=False,
            reason="cancelled",
            late_result_kept=kept,
        ) from None


@tracing.traced("complete")
def complete_many(items: Iterable[tuple[str, str, JSON]], *, agent: Agent) -> list[Todo | TodoNotFound | TodoConflict]:
    """complete for a batch of (todo_id, lease_id, result) in one statement; one outcome per item, in order."""
    items = list(items)
    if not items:
        return []
    if len(items) > MAX_COMPLETE_BATCH:
        raise InvalidTransitionInput(f"At most {MAX_COMPLETE_BATCH} completions a batch.", field="items")
    done = {
        todo.id: todo
        for todo in fetch_todos(
            sql.COMPLETE_MANY,
            {
                "ids": [i for i, _, _ in items],
                "lease_ids": [lease for _, lease, _ in items],
                "results": [Jsonb(r) if r is not None else None for _, _, r in items],
                "agent": agent.name,
                "visible": visible_patterns(agent),
            },
        )
    }
    outcomes: list[Todo | TodoNotFound | TodoConflict] = []
    for todo_id, lease_id, _ in items:
        if todo_id in done:
            outcomes.append(done.pop(todo_id))
        else:
            outcomes.append(miss(todo_id, agent, "complete", lease_id))  # type: ignore[arg-type]
    for outcome in outcomes:
        # Each item counts as one complete, as if it had been its own call.
        TRANSITIONS.labels(verb="complete", outcome="ok" if isinstance(outcome, Todo) else outcome.code).inc()
    return outcomes


@counted("fail", lambda todo: "dead_lettered" if states.DEAD_LETTER.holds(todo) else "retry_scheduled")
@tracing.traced("fail")
def fail(todo_id: str, *, agent: Agent, lease_id: str, error: str = "", retry_in_seconds: float | None = None) -> Todo:
    """claimed -> failed: a retry is scheduled below the cap, a dead-letter at it. Needs the current receipt."""
    return with_receipt(
        sql.FAIL,
        "fail",
        todo_id,
        agent,
        lease_id,
        error=error,
        retry_in=retry_in_seconds,
        backoff_base=float(settings.QUEUE_RETRY_BASE_SECONDS),
        backoff_cap=float(settings.QUEUE_RETRY_CAP_SECONDS),
    )


@counted("release")
@tracing.traced("release")
def release(todo_id: str, *, agent: Agent, lease_id: str) -> Todo:
    """claimed -> pending, giving the attempt back. Needs the current receipt."""
    return with_receipt(sql.RELEASE, "release", todo_id, agent, lease_id)
