"""Todos as MCP Tasks on the 2025-11-25 wire (issue 33 item 1): the experimental tasks of that revision's
core (basic/utilities/tasks), which VS Code's Copilot Chat speaks, beside the 2026-07-28 extension of
todos/mcp/tasks.py.

Which wire a request gets is negotiated per session, from the protocol version the client settled in
initialize (every later request names it in ``MCP-Protocol-Version``): a 2025-11-25 session gets this wire,
a 2026-07-28 request that declares ``io.modelcontextprotocol/tasks`` gets the extension, any other gets
neither. The server is stateless (todos/mcp/server.py), so nothing but the version is remembered, and a
task is its todo: ``taskId`` is the todo's id, any process answers for any task.

The SDK (mcp 2.3.0) has the 2025-11-25 task types but no runtime, and its runner sieves a legacy
``tools/call`` result through CallToolResult, which a CreateTaskResult is not. So this wire is served as a
``Server.middleware``, the SDK's seam for owning a method's whole answer:

* ``initialize`` at 2025-11-25 declares ``capabilities.tasks`` (list, cancel, task-augmented tools/call);
  ``tools/list`` marks create_for ``execution.taskSupport: "optional"`` (every other tool: absent, forbidden);
* ``tools/call`` create_for with ``params.task`` creates the todo and answers ``{"task": Task}``;
* ``notifications/tasks/status`` on the stream a client opens with GET /mcp (as VS Code and the TypeScript
  SDK do after initialize): each of the caller's tasks whose todo changed, re-read every
  MCP_TASK_STATUS_POLL_SECONDS on the loop (a query in the pool, no thread held), the stream one of the
  agent's await slots while it is open (``status_stream``, served by todos/mcp/server.py);
* ``tasks/get``, ``tasks/cancel`` (the queue's cancel; a finished task is -32602, as the spec asks),
  ``tasks/list`` (the caller's task-augmented creates in its scopes, newest first, by cursor) and
  ``tasks/result``, which blocks until the todo finishes on the await machinery of todos/results.py (an
  asyncio event woken by the listener, no thread held, one of the agent's await slots while it waits)
  and answers create_for's result, or its error for a dead-letter or a cancelled todo.

Scopes are the tools', and a task is the caller's: a todo outside its scopes, or one it did not create as a
task (what tasks/get reaches, tasks/list must list), is -32602, task not found. The todo's ``source``
(``mcp-task:<agent key>``) records whose task it is; agents cannot set such a source over REST.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.db.models import Q
from django.utils.dateparse import parse_datetime
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND
from rest_framework import serializers

from switchboard import dberrors
from switchboard.api import error_body
from todos import budgets, queue, results, states
from todos.api.fields import _iso
from todos.api.serializers import TodoCreateInput, TodoSerializer
from todos.errors import BudgetExceeded, QueueError
from todos.limits import (
    DEFAULT_LIST_LIMIT,
    LONG_POLL_MAX_SECONDS,
    MCP_TASK_STATUS_BATCH,
    MCP_TASK_STATUS_POLL_SECONDS,
)
from todos.mcp import tasks, tools
from todos.models import Agent, Todo

logger = logging.getLogger(__name__)

VERSION = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
TASK_TOOLS = ("create_for",)  # the tools a client may augment with a task


def on_this_wire(ctx: ServerRequestContext[Any]) -> bool:
    return ctx.protocol_version == VERSION


def task_source(agent: Agent) -> str:
    """The ``source`` of a todo an agent created as a task: what ``tasks/list`` lists (by the agent's key,
    which fits the column whatever the name's length)."""
    return f"mcp-task:{agent.pk}"


def task_of(todo: Todo) -> dict[str, Any]:
    """The todo as this wire's Task (flat in tasks/get's and tasks/cancel's results)."""
    modern = tasks.task_of(todo, detailed=False)
    task: dict[str, Any] = {
        "taskId": todo.id,
        "status": modern["status"],
        "createdAt": _iso(todo.created_at),
        "lastUpdatedAt": _iso(todo.updated_at),
        "ttl": None,  # kept until retention removes it after it finishes
        "pollInterval": tasks.POLL_INTERVAL_MS,
    }
    if "statusMessage" in modern:
        task["statusMessage"] = modern["statusMessage"]
    return task


def _params(ctx: ServerRequestContext[Any]) -> dict[str, Any]:
    return dict(ctx.params or {})


def _task_id(ctx: ServerRequestContext[Any]) -> str:
    task_id = _params(ctx).get("taskId")
    if not isinstance(task_id, str):
        raise MCPError(code=INVALID_PARAMS, message="taskId (a string) is required.")
    return task_id


def _answer(error: Exception) -> MCPError:
    """An exception of a task method as its JSON-RPC error: tasks.py's rules (the REST body as data)."""
    if isinstance(error, MCPError):
        return error
    if isinstance(error, QueueError):
        if error.code == "not_found":
            return tasks._not_found()
        return tasks._invalid_params(error_body(error.code, error.detail, **error.extra))
    if isinstance(error, serializers.ValidationError):
        return tasks._invalid_params(error_body("invalid", "The request is invalid.", fields=error.detail))
    if isinstance(error, DatabaseError) and dberrors.error_answer(error) is not None:
        return MCPError(code=INTERNAL_ERROR, message="The database is unavailable; retry shortly.")
    logger.error("tasks (2025-11-25): unexpected error", exc_info=error)
    return MCPError(code=INTERNAL_ERROR, message="An unexpected error occurred.")


async def _create_task(ctx: ServerRequestContext[Any], agent: Agent) -> HandlerResult:
    params = _params(ctx)
    name = params.get("name")
    if name not in TASK_TOOLS:
        # taskSupport absent means forbidden: the spec's answer to a task-augmented call of such a tool.
        raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {str(name)[:100]!r} does not support tasks.")
    if not isinstance(params.get("task"), dict):
        raise MCPError(code=INVALID_PARAMS, message="task must be an object ({ttl?}).")
    arguments = params.get("arguments") or {}
    if not isinstance(arguments, dict) or "todos" in arguments:
        raise MCPError(code=INVALID_PARAMS, message="A task is one todo: a batch (todos) cannot be a task.")

    async def create(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
        data = tools._valid(TodoCreateInput, args)

        def run() -> dict[str, Any]:
            todo, created = queue.create(agent=agent, **{**data, "source": task_source(agent)})
            return {"todo": todo, "created": created}

        made = await tools.in_thread(run)
        return {"task": task_of(made["todo"])}

    result = await tools.call("create_for", agent, arguments, run=create)
    if result.is_error:
        return result  # the create was refused: create_for's tool error, as without a task
    return dict(result.structured_content or {})


def _own(agent: Agent, task_id: str) -> Todo:
    """One of the caller's tasks: a todo in its scopes that it created as a task. The spec asks that what
    tasks/get reaches, tasks/list lists; so a todo created otherwise is no task here (-32602, not found)."""
    todo = tasks._visible(agent, task_id)
    if todo.source != task_source(agent):
        raise tasks._not_found()
    return todo


async def _get(agent: Agent, task_id: str) -> dict[str, Any]:
    return await tools.in_thread(lambda: task_of(_own(agent, task_id)))


async def _cancel(agent: Agent, task_id: str) -> dict[str, Any]:
    def cancel() -> dict[str, Any]:
        todo = _own(agent, task_id)
        if states.FINISHED.holds(todo):
            status = tasks.task_status(todo)
            raise MCPError(code=INVALID_PARAMS, message=f"Cannot cancel task: already in terminal status '{status}'")
        try:
            todo = queue.cancel(todo.id, operator=agent.name, reason="tasks/cancel", agent=agent)
        except QueueError as exc:
            if exc.code != "conflict":
                raise
            todo = _own(agent, task_id)  # it finished meanwhile: its status tells
        return task_of(todo)

    return await tools.in_thread(cancel)


def _after(value: Any) -> Q | None:
    """The keyset condition of a cursor: todos older than the last one shown (by created_at, then id)."""
    if value is None:
        return None
    try:
        created, todo_id = json.loads(base64.urlsafe_b64decode(str(value)[:200].encode()))
        at = parse_datetime(created)
    except (ValueError, TypeError, binascii.Error):
        at = None
    if at is None or not isinstance(todo_id, str):
        raise MCPError(code=INVALID_PARAMS, message="Invalid cursor.")
    return Q(created_at__lt=at) | Q(created_at=at, id__lt=todo_id)


async def _list(agent: Agent, cursor: Any) -> dict[str, Any]:
    after = _after(cursor)

    def page() -> dict[str, Any]:
        todos = Todo.objects.visible_to(agent).filter(source=task_source(agent))
        if after is not None:  # keyset paging, newest first: stable while tasks are added
            todos = todos.filter(after)
        rows = list(todos.order_by("-created_at", "-id")[: DEFAULT_LIST_LIMIT + 1])
        answer: dict[str, Any] = {"tasks": [task_of(todo) for todo in rows[:DEFAULT_LIST_LIMIT]]}
        if len(rows) > DEFAULT_LIST_LIMIT:
            last = rows[DEFAULT_LIST_LIMIT - 1]
            key = json.dumps([last.created_at.isoformat(), last.id]).encode()
            answer["nextCursor"] = base64.urlsafe_b64encode(key).decode()
        return answer

    return await tools.in_thread(page)


async def _result(agent: Agent, task_id: str) -> dict[str, Any]:
    """create_for's result once the todo has finished: awaited in LONG_POLL_MAX_SECONDS rounds (each one
    of the agent's await slots, an event on the loop: no thread waits), as long as the client keeps the
    request open."""
    todo = await tools.in_thread(lambda: _own(agent, task_id))
    while not states.FINISHED.holds(todo):
        todo = await results.await_finished(agent, task_id, LONG_POLL_MAX_SECONDS)
    body = await tools.in_thread(lambda: {"todo": TodoSerializer(todo).data, "created": True})
    status = tasks.task_status(todo)
    if status == "completed":
        result = tools.tool_result(body)
    else:
        last = todo.errors[-1] if todo.errors else {}
        detail = str(last.get("reason") or last.get("error") or status)
        result = tools.error_result(error_body(status, detail, todo=body["todo"]))
    answer = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    answer["_meta"] = {RELATED_TASK: {"taskId": todo.id}}
    return answer


async def middleware(ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
    """The 2025-11-25 wire on the SDK's middleware seam; every other request passes through."""
    if ctx.method == "initialize":
        result = await call_next(ctx)
        if isinstance(result, dict) and result.get("protocolVersion") == VERSION:
            result["capabilities"] = {**result.get("capabilities", {}), "tasks": CAPABILITY}
        return result
    if not on_this_wire(ctx):
        return await call_next(ctx)
    if ctx.method == "tools/list":
        result = await call_next(ctx)
        if isinstance(result, dict):
            for tool in result.get("tools", []):
                if tool.get("name") in TASK_TOOLS:
                    tool["execution"] = {"taskSupport": "optional"}
        return result
    augmented = ctx.method == "tools/call" and _params(ctx).get("task") is not None
    if not augmented and ctx.method not in ("tasks/get", "tasks/cancel", "tasks/list", "tasks/result"):
        return await call_next(ctx)
    agent = tasks._agent(ctx)
    try:
        if augmented:
            return await _create_task(ctx, agent)
        if ctx.method == "tasks/list":
            return await _list(agent, _params(ctx).get("cursor"))
        task_id = _task_id(ctx)
        if ctx.method == "tasks/get":
            return await _get(agent, task_id)
        if ctx.method == "tasks/cancel":
            return await _cancel(agent, task_id)
        return await _result(agent, task_id)
    except Exception as exc:  # each mapped by _answer: an unexpected one is logged, its text never sent
        raise _answer(exc) from None


def install(server: Any) -> None:
    server.middleware.append(middleware)


# --- notifications/tasks/status on GET /mcp -------------------------------------------------------------

# A transaction's rows carry its start time as updated_at, so one that commits after a re-read may hold an
# older time than that re-read saw: each re-read looks back this far and skips what it already sent.
_LOOK_BACK = timedelta(seconds=5)


def _changed(agent: Agent, since: datetime | None, sent: dict[str, datetime]) -> tuple[list[Todo], datetime]:
    """The caller's tasks changed since ``since`` (None: from now on) and not sent yet, oldest first."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now: datetime = cursor.fetchone()[0]
    if since is None:
        return [], now
    todos = Todo.objects.visible_to(agent).filter(source=task_source(agent), updated_at__gt=since - _LOOK_BACK)
    rows = todos.order_by("updated_at", "id")[: MCP_TASK_STATUS_BATCH * 2]
    fresh = [todo for todo in rows if sent.get(todo.id) != todo.updated_at]
    return fresh[:MCP_TASK_STATUS_BATCH], now


def wants_status_stream(scope: dict[str, Any]) -> bool:
    """A GET /mcp of a 2025-11-25 session that accepts an event stream: the client listens."""
    headers = {name.lower(): value for name, value in scope.get("headers", [])}
    return (
        scope.get("method") == "GET"
        and headers.get(b"mcp-protocol-version") == VERSION.encode()
        and b"text/event-stream" in headers.get(b"accept", b"")
    )


async def status_stream(agent: Agent, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Serve GET /mcp as the session's notification stream: ``notifications/tasks/status`` for each of the
    agent's tasks as its todo changes, until the client hangs up."""
    try:
        slot = budgets.wait_slots.slot(agent)
        slot.__enter__()
    except BudgetExceeded as exc:
        body = json.dumps(error_body(exc.code, exc.detail, **exc.extra)).encode()
        retry = str(exc.extra.get("retry_after", 1)).encode()
        headers = [(b"content-type", b"application/json"), (b"retry-after", retry)]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    gone, watcher = tools.watch_disconnect(receive)
    try:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        sent: dict[str, datetime] = {}
        since: datetime | None = (await tools.in_thread(functools.partial(_changed, agent, None, sent)))[1]
        await send({"type": "http.response.body", "body": b": listening\n\n", "more_body": True})
        while not gone.is_set():
            try:
                todos, since = await tools.in_thread(functools.partial(_changed, agent, since, dict(sent)))
            except DatabaseError:
                logger.warning("tasks (2025-11-25): a status re-read failed; trying again", exc_info=True)
                todos = []
            chunks = []
            for todo in todos:
                sent[todo.id] = todo.updated_at
                message = {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task_of(todo)}
                chunks.append(f"event: message\ndata: {json.dumps(message, separators=(',', ':'))}\n\n")
            if since is not None and len(sent) > 10 * MCP_TASK_STATUS_BATCH:  # bounded: forget the old ones
                horizon = since - 2 * _LOOK_BACK
                sent = {key: at for key, at in sent.items() if at > horizon}
            await send({"type": "http.response.body", "body": "".join(chunks).encode() or b": \n\n", "more_body": True})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), timeout=MCP_TASK_STATUS_POLL_SECONDS)
    except OSError:
        pass  # the client went away mid-send
    finally:
        watcher.cancel()
        slot.__exit__(None, None, None)
