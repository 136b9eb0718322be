"""Named counters (issue 30: a worker's usage, a tree's budget) and whether a tree has spent its budget: the one
rule the API's fields and the queue's doors check them by (todos/queue/trees.py writes them)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from todos import sql, states
from todos.errors import InvalidTransitionInput
from todos.limits import MAX_USAGE_COUNTERS, MAX_USAGE_NAME_CHARS, MAX_USAGE_VALUE
from todos.models import Todo
from todos.rows import fetchall

_COUNTER_NAME = re.compile(rf"[A-Za-z0-9_.\-]{{1,{MAX_USAGE_NAME_CHARS}}}")


def counters(value: Any, field: str, *, positive: bool = False, index: int | None = None) -> dict[str, float] | None:
    """``value`` as named counters ({name: number}): at most MAX_USAGE_COUNTERS names of letters, digits and
    _ . -, each a finite number from 0 (above 0 when ``positive``: a budget) to MAX_USAGE_VALUE; None stays
    None. Else InvalidTransitionInput naming ``field``."""
    if value is None:
        return None
    where = f"todos.{index}.{field}" if index is not None else field
    least = "above 0" if positive else "0 or more"
    problem = (
        f"{field} is an object of at most {MAX_USAGE_COUNTERS} named counters (names of 1-{MAX_USAGE_NAME_CHARS} "
        f"letters, digits, _ . -), each a number {least}, at most {MAX_USAGE_VALUE:g}."
    )
    if not isinstance(value, Mapping) or len(value) > MAX_USAGE_COUNTERS:
        raise InvalidTransitionInput(problem, field=where)
    for name, number in value.items():
        if (
            not isinstance(name, str)
            or not _COUNTER_NAME.fullmatch(name)
            or isinstance(number, bool)
            or not isinstance(number, int | float)
            or (isinstance(number, float) and not math.isfinite(number))
            or number < 0
            or (positive and number == 0)
            or number > MAX_USAGE_VALUE
        ):
            raise InvalidTransitionInput(problem, field=where)
    return dict(value)


# The states in which a todo shows blocked: "budget": waiting for a claim (a claimed one learns it from its
# heartbeat; a finished one is past it).
_BLOCKABLE = states.PENDING | states.SCHEDULED | states.WAITING | states.RETRY_WAITING


def blocked(todo: Todo) -> dict[str, Any] | None:
    """What a todo's JSON shows as ``blocked``: a parked limit's {limit, until, reason} when a reader loaded one
    (issue 31), else {"reason": "budget", "root_id"} while it waits for a claim in a tree whose budget is spent
    (issue 30), else None. A todo outside any tree reads nothing; a child reads its root's flag unless
    ``load_blocked`` did (a render on the event loop must not query)."""
    parked: dict[str, Any] | None = getattr(todo, "blocked", None)
    if parked is not None:
        return parked
    if todo.budget_exhausted is None:  # a todo outside any tree, or in a tree without a budget
        return None
    if not _BLOCKABLE.holds(todo):
        return None
    exhausted = getattr(todo, "tree_budget_exhausted", None)
    if exhausted is None:
        exhausted = budget_exhausted(todo)
    return {"reason": "budget", "root_id": todo.root_id or todo.id} if exhausted else None


def load_blocked(todos: Iterable[Todo]) -> None:
    """Read, in one query, the root flags ``blocked`` needs for these todos (in place), so that rendering
    them queries nothing."""
    children = [t for t in todos if t.root_id is not None and t.budget_exhausted is not None and _BLOCKABLE.holds(t)]
    if not children:
        return
    spent = set(
        Todo.objects.filter(pk__in={t.root_id for t in children}, budget_exhausted=True).values_list("pk", flat=True)
    )
    for todo in children:
        todo.tree_budget_exhausted = todo.root_id in spent  # type: ignore[attr-defined]


def budget_exhausted(todo: Todo) -> bool:
    """Whether ``todo``'s tree has spent its budget (its root's flag: a read for a child)."""
    if todo.root_id is None or todo.budget_exhausted is None:  # a root's own flag; a child's marker: no budget
        return bool(todo.budget_exhausted)
    rows = fetchall(sql.TREE_BLOCKED, {"root": todo.root_id})
    return bool(rows and rows[0][0])


# Unfinished children the dashboard's orphan count walks at most (a count past it reads "at least").
ORPHANS_WALKED = 100_000


def orphans() -> int:
    """Children whose parent was cancelled or dead-lettered while they are unfinished (the dashboard)."""
    rows = fetchall(sql.ORPHANS, {"cap": ORPHANS_WALKED})
    return int(rows[0][0]) if rows else 0


def recent_usage(minutes: int = 60) -> dict[str, dict[str, dict[str, float]]]:
    """Usage of the todos completed in the last ``minutes``, {"queue": {name: {counter: sum}}, "agent": {...}}
    (the dashboard)."""
    answer: dict[str, dict[str, dict[str, float]]] = {"queue": {}, "agent": {}}
    for kind, name, counter, total in fetchall(sql.RECENT_USAGE, {"minutes": minutes}):
        answer[kind].setdefault(name, {})[counter] = float(total)
    return answer
