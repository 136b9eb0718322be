"""Awaiting a todo's result (issue 21): ``GET /api/v1/todos/<id>/?wait_seconds=N`` and MCP ``get_todo``
answer when the todo is finished (states.FINISHED: done, a dead-letter, cancelled) or the time runs out.

An awaiting request is an ``asyncio.Event`` in its loop: no thread and no database connection while it
waits, like a long-poll claim (todos/longpoll.py). What wakes it is one shared read per loop: while any
await is open, every POLL_SECONDS one statement (a primary-key lookup of the awaited ids, whatever their
number) asks which of them have finished, and wakes their awaiters. So N awaiters cost one indexed read
per tick, and an idle process none; a result is seen at most POLL_SECONDS after it is written.

Why a shared read and not a NOTIFY from the finishing statements: complete is the hottest statement,
and a NOTIFY serialises commits on PostgreSQL's notification queue lock; every complete would pay it for
the rare todo someone awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError

from switchboard import dberrors, executor
from todos import budgets, states
from todos.errors import TodoNotFound
from todos.models import Agent, Todo

logger = logging.getLogger(__name__)

T = TypeVar("T")

POLL_SECONDS = 0.2


def _visible(agent: Agent, todo_id: str) -> Todo:
    todo = Todo.objects.visible_to(agent).filter(pk=todo_id).first()
    if todo is None:
        raise TodoNotFound(f"No todo {todo_id}.")
    return todo


def _finished_ids(ids: list[str]) -> set[str]:
    return set(Todo.objects.filter(states.FINISHED.q, pk__in=ids).values_list("pk", flat=True))


async def _run(function: Callable[..., T], *args: Any) -> T:
    return await executor.run(function, *args)


class _LoopAwaits:
    """The open awaits of one event loop (the server's; under WSGI or the test client, a request's own)
    and the one task that reads for them."""

    def __init__(self) -> None:
        self.events: dict[str, set[asyncio.Event]] = {}
        self.reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        try:
            while self.events:
                await asyncio.sleep(POLL_SECONDS)
                if not self.events:
                    break
                try:
                    finished = await _run(_finished_ids, list(self.events))
                except DatabaseError as exc:  # the database is down or busy: read again next tick
                    dberrors.log_failure(logger, "reading awaited todos", exc)
                    continue
                except Exception:  # a bug: said with its traceback, and the awaits still end at their timeout
                    logger.exception("reading awaited todos failed")
                    continue
                for todo_id in finished:
                    for event in self.events.get(todo_id, ()):
                        event.set()
        finally:
            self.reader = None


_lock = threading.Lock()
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopAwaits] = weakref.WeakKeyDictionary()


def _awaits() -> _LoopAwaits:
    loop = asyncio.get_running_loop()
    with _lock:
        awaits = _by_loop.get(loop)
        if awaits is None:
            awaits = _by_loop[loop] = _LoopAwaits()
    return awaits


async def await_finished(agent: Agent, todo_id: str, wait_seconds: float) -> Todo:
    """The todo as it is once it has finished, or after ``wait_seconds`` (0: at once). Visibility is GET's:
    a todo outside the agent's scopes is not found, before any wait."""
    todo = await _run(_visible, agent, todo_id)
    if wait_seconds <= 0 or states.FINISHED.holds(todo):
        return todo
    # One of the agent's open waits (todos/budgets.py), given back however the await ends.
    with budgets.wait_slots.slot(agent):
        awaits = _awaits()
        event = asyncio.Event()
        awaits.events.setdefault(todo_id, set()).add(event)
        if awaits.reader is None:
            awaits.reader = asyncio.get_running_loop().create_task(awaits.read())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=wait_seconds)
        finally:
            waiting = awaits.events.get(todo_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del awaits.events[todo_id]
    return await _run(_visible, agent, todo_id)
