"""Agent trees, issue 30 items 3-5: cascading cancel (resumed by reap_once), a cancelled todo's late result, and
budgets (usage reported under a receipt, a root's budget set by an operator). The statements are in
todos/sql/trees.py and todos/sql/functions/todos_cascade.sql."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from psycopg.types.json import Jsonb

from todos import sql
from todos.errors import InvalidTransitionInput
from todos.limits import CASCADE_BATCH, CASCADES_PER_REAP
from todos.metrics import TRANSITIONS, counted
from todos.models import Agent, Todo, visible_patterns
from todos.queue._common import JSON, one
from todos.rows import fetch_todos, fetchall
from todos.usage import counters

CHILDREN_POLICIES = ("keep", "cancel")


def usage_param(usage: Any) -> Jsonb | None:
    """A report's usage as the statements' %(usage)s: validated, NULL when none (or empty)."""
    checked = counters(usage, "usage")
    return Jsonb(checked) if checked else None


def cascade(ids: list[str], *, by: str, why: str, agent: Agent | None, bound: int = CASCADE_BATCH) -> int:
    """Up to ``bound`` unfinished descendants of ``ids`` (in the queues ``agent`` may see; every queue for an
    operator) -> cancelled, each recording 'ancestor <id> <why>'; more left: the ancestors are marked and
    reap_once finishes them. -> how many this statement cancelled."""
    rows = fetchall(sql.CASCADE, {"ids": ids, "by": by, "why": why, "visible": visible_patterns(agent), "bound": bound})
    cancelled = int(rows[0][0]) if rows else 0
    if cancelled:
        TRANSITIONS.labels(verb="cascade_cancel", outcome="ok").inc(cancelled)
    return cancelled


def resume_cascades(*, batch: int = CASCADE_BATCH) -> int:
    """reap_once's step: each cascade left over (an ancestor marked), one more statement's bound of its
    descendants. -> how many were cancelled."""
    total = 0
    for todo_id, by, why, visible in fetchall(sql.CASCADES_LEFT, {"n": CASCADES_PER_REAP}):
        rows = fetchall(sql.CASCADE, {"ids": [todo_id], "by": by, "why": why, "visible": visible, "bound": batch})
        total += int(rows[0][0]) if rows else 0
    if total:
        TRANSITIONS.labels(verb="cascade_cancel", outcome="ok").inc(total)
    return total


def keep_late_result(todo_id: str, *, agent: Agent, lease_id: str, result: JSON) -> bool:
    """A complete that came after a cancel revoked its receipt: keep the result as the todo's late_result
    (the first one only). -> whether it was kept."""
    return bool(
        fetchall(
            sql.LATE_RESULT,
            {
                "id": todo_id,
                "lease_id": lease_id,
                "agent": agent.name,
                "visible": visible_patterns(agent),
                "result": Jsonb(result),
            },
        )
    )


@counted("set_budget")
def set_budget(todo_id: str, *, budget: Any, agent: Agent | None = None) -> Todo:
    """A root's budget ({name: limit}, replacing the one it had), budget_exhausted decided again on its tree's
    usage: raising it unblocks the tree. A tree that had no budget gets its children marked (MARK_BUDGETED), in
    the same transaction, so that claims check the root for them. ``agent`` None: an operator of every queue."""
    checked = counters(budget, "budget", positive=True)
    if not checked:
        raise InvalidTransitionInput("budget names at least one counter.", field="budget")
    with transaction.atomic():
        rows = fetch_todos(
            sql.SET_BUDGET, {"id": todo_id, "budget": Jsonb(checked), "visible": visible_patterns(agent)}
        )
        if rows:  # the root is locked: mark the children its tree had while it had no budget
            fetchall(sql.MARK_BUDGETED, {"id": todo_id})
    return one(rows, todo_id, agent, "set the budget of (only a tree's root has one)")
