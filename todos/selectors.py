"""Reads that need one hand-written statement (todos/sql/): the per-queue health counts that
GET /api/v1/queues/, the admin dashboard and /metrics all report, the moment a long-polling claim
should wake up without a write, and a todo's dependencies for its JSON. The first two read only through
the partial indexes of todos/models.py, never through done history."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from todos import sql
from todos.errors import TodoNotFound
from todos.limits import (
    DEPENDENCY_RESULTS_MAX_BYTES,
    MAX_DEPENDENCIES,
    MAX_SHOWN_RESULT_CHARS,
    MAX_TREE_PAGE,
    MAX_TREE_WALK,
)
from todos.models import ALL_QUEUES, Agent, Todo, TodoState, glob_to_like, visible_patterns
from todos.rows import fetchall
from todos.usage import load_blocked


@dataclass(frozen=True)
class QueueStats:
    queue: str
    pending: int
    claimed: int
    retry_waiting: int
    dead_letters: int
    oldest_pending: datetime | None
    # By the database's clock (SPEC decision 7); None when nothing is pending.
    oldest_pending_age_seconds: float | None
    scheduled: int = 0
    cancelled: int = 0
    # The queue's controls (todos/controls.py).
    paused: bool = False
    max_claimed: int | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None
    # Waiting for a dependency, an event, a token or a resolve (issue 20): still runnable, never claimed.
    waiting: int = 0

    @property
    def failed(self) -> int:
        return self.retry_waiting + self.dead_letters

    @property
    def unfinished(self) -> int:
        return self.pending + self.claimed + self.failed + self.scheduled + self.waiting


def queue_stats(agent: Agent | None = None) -> list[QueueStats]:
    """Counts for every queue the agent may see (its claim and create scopes), or every queue for
    ``None`` (the operator's views), by name. A registered queue with nothing in it reports zeros."""
    visible = visible_patterns(agent)
    with connection.cursor() as cursor:
        cursor.execute(sql.QUEUE_STATS, {"visible": visible})
        return [QueueStats(*row) for row in cursor.fetchall()]


def seconds_until_claimable(agent: Agent, queues: list[str] | None = None) -> float | None:
    params: dict[str, Any] = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [glob_to_like(q) for q in queues] if queues else ALL_QUEUES,
        "agent": agent.name,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql.SECONDS_UNTIL_CLAIMABLE, params)
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


# A todo's JSON lists its dependencies (at most MAX_DEPENDENCIES, as the API accepts), and their results up
# to DEPENDENCY_RESULTS_MAX_BYTES of JSON together: a dependency past the budget shows "result_truncated":
# true and no result (GET it for the whole). docs/api.md says so.


def dependencies_of(todo_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each todo's dependencies in the order it named them: id, state (null once retention removed it),
    dead_letter and result. One statement for all the todos."""
    listed: dict[str, list[dict[str, Any]]] = {i: [] for i in todo_ids}
    spent: dict[str, int] = dict.fromkeys(todo_ids, 0)
    rows = fetchall(sql.DEPENDENCIES_OF, {"ids": todo_ids, "limit": MAX_DEPENDENCIES})
    for dependent, dependency, state, dead, result, size in rows:
        # The connection hands jsonb back as text (Django decodes its JSONFields itself).
        value = json.loads(result) if isinstance(result, str) else result
        entry: dict[str, Any] = {"id": dependency, "state": state, "dead_letter": bool(dead), "result": value}
        if size is not None and spent[dependent] + size > DEPENDENCY_RESULTS_MAX_BYTES:
            entry["result"] = None
            entry["result_truncated"] = True
        elif size is not None:
            spent[dependent] += size
        listed[dependent].append(entry)
    return listed


def attach_dependencies(todos: list[Any]) -> None:
    """Load the dependencies of the todos that have any, in one statement, onto ``todo.dependency_list``
    (which the serializer renders): for answers rendered where no query may run (the async claim)."""
    having = [t for t in todos if t.depends_on]
    if having:
        listed = dependencies_of([t.id for t in having])
        for todo in having:
            todo.dependency_list = listed[todo.id]


def show_blocked(todos: Iterable[Todo]) -> None:
    """A pending or scheduled todo held by a parked limit (issue 31) shows ``blocked``: {limit, until, reason}
    (todos/sql/flow.py BLOCKED), set on each todo given, in place; one query for all, none when no todo given
    can be blocked. A read, never a transition."""
    waiting = [t for t in todos if t.state in (TodoState.PENDING, TodoState.SCHEDULED)]
    if not waiting:
        return
    with connection.cursor() as cursor:
        cursor.execute(sql.BLOCKED_OF, {"ids": [t.id for t in waiting]})
        found = dict(cursor.fetchall())
    for todo in waiting:
        value = found.get(todo.id)
        todo.blocked = json.loads(value) if isinstance(value, str) else value  # type: ignore[attr-defined]


def show_awaited(todos: Iterable[Todo]) -> None:
    """A resolution by todos stores their ids; shown (on each todo given, in place) with each one's state
    and result as they are now, read in one query for all. A result over MAX_SHOWN_RESULT_CHARS of JSON
    reads {"truncated": true}: GET that todo for all of it. A read, never a transition. Also reads the budget
    flag of each child's root (todos/usage.py, load_blocked), so that rendering them queries nothing."""
    todos = list(todos)
    load_blocked(todos)
    resolved: list[tuple[Todo, dict[str, Any]]] = [
        (t, t.resolution)
        for t in todos
        if isinstance(t.resolution, dict) and isinstance(t.resolution.get("todos"), list)
    ]
    ids = {i["id"] if isinstance(i, dict) else i for _, r in resolved for i in r["todos"]}
    if not ids:
        return
    found = {row["id"]: row for row in Todo.objects.filter(pk__in=ids).values("id", "state", "result")}
    for todo, resolution in resolved:
        shown = []
        for item in resolution["todos"]:
            todo_id = item["id"] if isinstance(item, dict) else item  # shown once already
            row = found.get(todo_id, {"state": None, "result": None})
            result = row["result"]
            if len(json.dumps(result)) > MAX_SHOWN_RESULT_CHARS:
                result = {"truncated": True}
            shown.append({"id": todo_id, "state": row["state"], "result": result})
        todo.resolution = {**resolution, "todos": shown}


# --- trees (issue 30) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeNode:
    id: str
    parent_id: str | None
    depth: int
    state: str
    dead_letter: bool
    queue: str
    kind: str
    title: str


@dataclass(frozen=True)
class TreePage:
    nodes: list[TreeNode]
    # Where the next page starts: (depth, id) of this page's last node; None when this is the last page.
    after: tuple[int, str] | None
    # The subtree of a todo below its root is walked up to MAX_TREE_WALK nodes: past that, some are missing.
    truncated: bool
    # The whole tree's usage summed on its root (issue 30), its budget and whether it is spent; None when the
    # root is outside the caller's scopes.
    tree_usage: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    budget_exhausted: bool = False


def tree_page(agent: Agent, todo_id: str, after: tuple[int, str] | None = None, limit: int = MAX_TREE_PAGE) -> TreePage:
    """One page of ``todo_id``'s subtree (itself first, then by depth and id), after ``after``. Nodes outside
    the agent's scopes are left out (a visible node's parent_id may still name one: an id, nothing more); a
    todo it cannot see is TodoNotFound, as for GET of it."""
    found = Todo.objects.visible_to(agent).filter(pk=todo_id).values_list("root_id", flat=True)
    if not found:
        raise TodoNotFound(f"No todo {todo_id}.")
    is_root = found[0] is None
    shown = (
        Todo.objects.visible_to(agent)
        .filter(pk=found[0] or todo_id)
        .values("tree_usage", "budget", "budget_exhausted")
        .first()
    )
    root: dict[str, Any] = dict(shown) if shown is not None else {}
    depth, after_id = after if after is not None else (-1, "")
    params = {
        "id": todo_id,
        "after_depth": depth,
        "after_id": after_id,
        "limit": limit + 1,  # one more: is there a next page
        "walk": MAX_TREE_WALK,
        "visible": visible_patterns(agent),
    }
    rows = fetchall(sql.TREE_OF_ROOT if is_root else sql.TREE_WALK, params)
    truncated = bool(rows) and not is_root and bool(rows[0][8])
    nodes = [TreeNode(*row[:8]) for row in rows[:limit]]
    more = len(rows) > limit
    return TreePage(
        nodes,
        (nodes[-1].depth, nodes[-1].id) if more else None,
        truncated,
        root.get("tree_usage"),
        root.get("budget"),
        bool(root.get("budget_exhausted")),
    )
