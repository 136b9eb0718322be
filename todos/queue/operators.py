"""The operators' doors (an operator in the admin, staff or a can-retry/can-manage agent over the API): each
a batch statement over ids (todos/sql/operators.py) with a single-todo form that says why it changed nothing.
``agent`` None is an operator of every queue; an agent acts only within its scopes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction

from todos import sql, tracing
from todos.errors import InvalidTransitionInput
from todos.metrics import counted, counted_batch
from todos.models import Agent, Todo, visible_patterns
from todos.queue import trees
from todos.queue._common import one, priority_problem
from todos.rows import fetch_todos, fetch_todos_reviving

_RETRY_MODES = ("reset", "once")


def _operate(statement: str, ids: Sequence[str], agent: Agent | None, **params: Any) -> list[Todo]:
    """One operator statement over ``ids``, within what ``agent`` may see: the todos it changed."""
    return fetch_todos(statement, {"ids": list(ids), "visible": visible_patterns(agent), **params})


def _check_mode(mode: str) -> None:
    if mode not in _RETRY_MODES:
        raise InvalidTransitionInput("mode must be 'reset' or 'once'.", field="mode")


@counted("retry_dead_letter")
def retry_dead_letter(todo_id: str, *, mode: str, operator: str, note: str = "", agent: Agent | None = None) -> Todo:
    """dead-letter -> pending. ``mode`` "reset" grants a full new budget, "once" exactly one more try.

    ``operator`` (a username or agent name) and ``note`` are recorded in the todo's errors.
    """
    _check_mode(mode)
    rows = fetch_todos_reviving(
        sql.RETRY_DEAD_LETTER,
        {"id": todo_id, "mode": mode, "operator": operator, "note": note, "visible": visible_patterns(agent)},
        "retry",
        todo_id,
    )
    return one(rows, todo_id, agent, "retry")


@counted_batch("retry_dead_letter")
def retry_dead_letter_many(
    ids: Sequence[str], *, mode: str, operator: str, note: str = "", agent: Agent | None = None
) -> list[Todo]:
    """retry_dead_letter for a batch, in one statement; returns the todos retried (the others did not
    pass the guard). A newer runnable todo holding one row's key fails the whole statement with
    TodoConflict(reason="idempotency_key_taken"): retry those one by one to find it."""
    _check_mode(mode)
    return fetch_todos_reviving(
        sql.RETRY_DEAD_LETTER_MANY,
        {"ids": list(ids), "mode": mode, "operator": operator, "note": note, "visible": visible_patterns(agent)},
        "retry",
        "a batch",
    )


@counted_batch("retry_now")
def retry_now_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """retry-waiting (failed, next_retry_at set) -> pending now, for each id that is retry-waiting."""
    return _operate(sql.RETRY_NOW, ids, agent, operator=operator)


@counted("retry_now")
def retry_now(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """retry-waiting (failed, next_retry_at set) -> pending now, without waiting for the backoff."""
    return one(_operate(sql.RETRY_NOW, [todo_id], agent, operator=operator), todo_id, agent, "retry now")


@counted_batch("discard")
def discard_many(ids: Sequence[str], *, operator: str, reason: str = "", agent: Agent | None = None) -> list[Todo]:
    """pending, scheduled or failed -> done with result {"discarded_by", "reason"}, for each id that qualifies."""
    return _operate(sql.DISCARD, ids, agent, operator=operator, reason=reason)


@counted("discard")
def discard(todo_id: str, *, operator: str, reason: str = "", agent: Agent | None = None) -> Todo:
    """pending, scheduled or failed -> done with result {"discarded_by", "reason"}. Not from claimed:
    force-release first."""
    return one(_operate(sql.DISCARD, [todo_id], agent, operator=operator, reason=reason), todo_id, agent, "discard")


@counted_batch("force_release")
def force_release_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """claimed -> pending whatever the receipt, for each id that is claimed."""
    return _operate(sql.FORCE_RELEASE, ids, agent, operator=operator)


@counted("force_release")
def force_release(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """claimed -> pending whatever the receipt (a stuck worker); recorded in errors, attempt kept."""
    return one(_operate(sql.FORCE_RELEASE, [todo_id], agent, operator=operator), todo_id, agent, "force-release")


def _cancel(ids: Sequence[str], operator: str, reason: str, agent: Agent | None, cascade: bool) -> list[Todo]:
    """CANCEL, then with ``cascade`` the unfinished descendants of what it cancelled, in one transaction
    (up to CASCADE_BATCH of them in it; reap_once finishes a bigger tree). Each todo cancelled carries
    ``cascaded``: how many descendants its cascade cancelled now (0 without one)."""
    if not cascade:  # one statement, outside a transaction: a deadlock aborting it is run again once
        cancelled = _operate(sql.CANCEL, ids, agent, operator=operator, reason=reason)
        for todo in cancelled:
            todo.cascaded = 0  # type: ignore[attr-defined]
        return cancelled
    with transaction.atomic():
        # The todos first, then their descendants: a tree's lock order, ancestors first (todos/sql/trees.py,
        # ancestors_first), the order a finish with children: "cancel" and a child's usage report take too.
        cancelled = _operate(sql.CANCEL, ids, agent, operator=operator, reason=reason)
        for todo in sorted(cancelled, key=lambda t: t.id):
            todo.cascaded = trees.cascade(  # type: ignore[attr-defined]
                [todo.id], by=operator, why=f"cancelled by {operator}", agent=agent
            )
    return cancelled


@counted_batch("cancel")
@tracing.traced("cancel")
def cancel_many(
    ids: Sequence[str], *, operator: str, reason: str = "", agent: Agent | None = None, cascade: bool = False
) -> list[Todo]:
    """pending, scheduled, retry-waiting or claimed -> cancelled, for each id that is cancellable; with
    ``cascade``, their unfinished descendants too."""
    return _cancel(ids, operator, reason, agent, cascade)


@counted("cancel")
@tracing.traced("cancel")
def cancel(todo_id: str, *, operator: str, reason: str = "", agent: Agent | None = None, cascade: bool = False) -> Todo:
    """pending, scheduled, retry-waiting or claimed -> cancelled (terminal). A claimed todo's lease is revoked: its
    worker's next heartbeat, complete or fail is a conflict with state cancelled. ``agent`` None: an
    operator (every queue); else the agent's claim or create scopes must cover the queue. ``cascade``: its
    unfinished descendants too, in the same transaction (those in queues ``agent`` may see), each recording
    'ancestor <id> cancelled by <operator>'; beyond CASCADE_BATCH of them, reap_once finishes the rest."""
    return one(_cancel([todo_id], operator, reason, agent, cascade), todo_id, agent, "cancel")


@counted_batch("run_now")
def run_now_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """scheduled -> pending now (run_at = now()), for each id that is scheduled."""
    return _operate(sql.RUN_NOW, ids, agent, operator=operator)


@counted("run_now")
def run_now(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """scheduled -> pending now, without waiting for run_at; recorded in errors."""
    return one(_operate(sql.RUN_NOW, [todo_id], agent, operator=operator), todo_id, agent, "run now")


def _set_priority(ids: Sequence[str], priority: int, agent: Agent | None) -> list[Todo]:
    if problem := priority_problem(priority):
        raise InvalidTransitionInput(problem, field="priority")
    return _operate(sql.SET_PRIORITY, ids, agent, priority=priority)


@counted_batch("set_priority")
def set_priority_many(ids: Sequence[str], *, priority: int, agent: Agent | None = None) -> list[Todo]:
    """The priority of each id that is pending or scheduled."""
    return _set_priority(ids, priority, agent)


@counted("set_priority")
def set_priority(todo_id: str, *, priority: int, agent: Agent | None = None) -> Todo:
    """A pending or scheduled todo's priority (409 once it has been claimed or finished)."""
    return one(_set_priority([todo_id], priority, agent), todo_id, agent, "change the priority of")
