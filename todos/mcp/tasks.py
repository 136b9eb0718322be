"""Todos as MCP Tasks: the ``io.modelcontextprotocol/tasks`` extension (SEP-2663, as the 2026-07-28
revision's extension text defines it), the smallest adapter over the official SDK.

The SDK (mcp 2.3.0) ships no runtime for this extension: its 2026-07-28 types leave tasks out, and the
2025-11-25 core tasks types are a different protocol. It does let a server serve extra request methods
(``Server.add_request_handler``), advertise an extension (``Server.extensions``) and answer ``tools/call``
with an extension's ``resultType``. This module uses exactly those three seams:

* the extension is declared under ``capabilities.extensions`` (server/discover, initialize);
* ``create_for`` called by a client that declares the extension in the request's
  ``io.modelcontextprotocol/clientCapabilities`` answers ``resultType: "task"`` with the todo as the task:
  ``taskId`` is the todo's id, so there is no task store, and any process can answer for any task;
* ``tasks/get`` renders the todo as a DetailedTask (the state mapping is ``task_status``), ``tasks/cancel``
  is the queue's cancel, and ``tasks/update`` resolves the todo's waitpoint (issue 20) with the
  ``inputResponses`` content as the resolution's data.

Scopes are the tools': a task is a todo the caller's token may see (else -32602, task not found, whatever
the reason, so ids do not leak); cancel needs what the cancel tool needs. A client that does not declare
the extension gets the plain ``create_for`` result, and -32021 from tasks/*. Task status notifications
(``subscriptions/listen``) are not offered: the extension makes them optional, and polling ``tasks/get``
is what a stateless server answers from any process.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DataError, InterfaceError, OperationalError
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from rest_framework import serializers

from switchboard import ids
from switchboard.api import error_body
from todos import queue, states
from todos.api.fields import _iso
from todos.api.serializers import ResolveInput, TodoSerializer
from todos.errors import QueueError
from todos.mcp import tools
from todos.models import Agent, Todo

logger = logging.getLogger(__name__)

EXTENSION = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 2000


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] = {}


def declares_tasks(ctx: ServerRequestContext[Any]) -> bool:
    """Whether this request's per-request client capabilities (2026-07-28) declare the extension."""
    meta = ctx.meta or {}
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
    if isinstance(capabilities, dict):
        extensions = capabilities.get("extensions")
        return isinstance(extensions, dict) and EXTENSION in extensions
    declared = ctx.session.client_capabilities if ctx.session is not None else None
    return bool(declared and declared.extensions and EXTENSION in declared.extensions)


def _missing_capability() -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message="Missing required client capability",
        data={"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
    )


def _not_found() -> MCPError:
    return MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")


def _input_key(todo: Todo) -> str:
    # One key per wait (its start is the row's last write while it waits): unique over the task's life,
    # the same on every poll of one wait, as the extension asks.
    return f"resolve-{todo.updated_at.timestamp():.6f}"


def task_status(todo: Todo) -> str:
    """The task status of a todo's state: the one table of todos/states.py (``TASK_STATES``)."""
    return states.task_state(todo).mcp


def _last_error(todo: Todo) -> dict[str, Any]:
    return todo.errors[-1] if todo.errors else {}


def task_of(todo: Todo, *, detailed: bool = True) -> dict[str, Any]:
    """The todo as a Task (CreateTaskResult's shape), or a DetailedTask (tasks/get's) when ``detailed``."""
    status = task_status(todo)
    task: dict[str, Any] = {
        "taskId": todo.id,
        "status": status,
        "createdAt": _iso(todo.created_at),
        "lastUpdatedAt": _iso(todo.updated_at),
        "ttlMs": None,  # a todo is kept until retention removes it after it finishes
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    message = (todo.progress or {}).get("message") if isinstance(todo.progress, dict) else None
    if status in ("failed", "cancelled"):
        message = str(_last_error(todo).get("reason") or _last_error(todo).get("error") or "") or message
    if message:
        task["statusMessage"] = message
    if not detailed:
        return task
    if status == "completed":
        # The result of the create_for call the task stands for: its structured content and text, with the
        # todo as it ended (its result included).
        body = {"todo": TodoSerializer(todo).data, "created": True}
        task["result"] = tools.tool_result(body).model_dump(by_alias=True, exclude_none=True, mode="json")
    elif status == "failed":
        task["error"] = {"code": INTERNAL_ERROR, "message": str(_last_error(todo).get("error") or "dead-letter")}
    elif status == "input_required":
        task["inputRequests"] = {
            _input_key(todo): {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": f"Todo {todo.id} ({todo.title or todo.queue}) waits for input to resolve it.",
                    "requestedSchema": {"type": "object", "properties": {}},
                },
            }
        }
    return task


def _agent(ctx: ServerRequestContext[Any]) -> Agent:
    from todos.mcp.server import AGENT_SCOPE_KEY

    agent = ctx.request.scope.get(AGENT_SCOPE_KEY) if ctx.request is not None else None
    if not isinstance(agent, Agent):  # cannot happen behind McpEndpoint
        raise MCPError(code=INVALID_PARAMS, message="No agent.")
    return agent


def _visible(agent: Agent, task_id: str) -> Todo:
    todo = Todo.objects.visible_to(agent).filter(pk=task_id).first() if ids.is_id(task_id, ids.TODO) else None
    if todo is None:
        raise _not_found()
    return todo


def _invalid_params(body: dict[str, Any]) -> MCPError:
    """-32602 with the REST error body as its data, so a client reads the same code and fields as REST's."""
    return MCPError(code=INVALID_PARAMS, message=str(body["error"]["detail"]), data=body)


async def _run(ctx: ServerRequestContext[Any], work: Any, *, extension: bool = True) -> dict[str, Any]:
    """Run a task method's work in the pool. Every failure is answered here: a refused transition or bad
    input is -32602 with the REST error body, a lost database INTERNAL_ERROR; anything else is logged with
    its cause and answered with a fixed text, so nothing unexpected reaches the SDK's own error text.
    ``extension``: the request must declare the 2026-07-28 extension (the 2025-11-25 wire passes False)."""
    if extension and not declares_tasks(ctx):
        raise _missing_capability()
    try:
        result: dict[str, Any] = await tools.in_thread(work)
        return result
    except MCPError:
        raise
    except (OperationalError, InterfaceError):
        raise MCPError(code=INTERNAL_ERROR, message="The database is unavailable; retry shortly.") from None
    except QueueError as exc:
        raise _invalid_params(error_body(exc.code, exc.detail, **exc.extra)) from None
    except serializers.ValidationError as exc:
        raise _invalid_params(error_body("invalid", "The request is invalid.", fields=exc.detail)) from None
    except DataError:
        logger.warning("tasks: the database refused a value", exc_info=True)
        raise _invalid_params(error_body("invalid", "A value cannot be stored (e.g. a NUL character).")) from None
    except Exception:
        logger.exception("tasks: unexpected error")
        raise MCPError(code=INTERNAL_ERROR, message="An unexpected error occurred.") from None


async def get_task(ctx: ServerRequestContext[Any], params: TaskIdParams) -> dict[str, Any]:
    agent = _agent(ctx)
    return await _run(ctx, lambda: {"resultType": "complete", **task_of(_visible(agent, params.task_id))})


async def cancel_task(ctx: ServerRequestContext[Any], params: TaskIdParams) -> dict[str, Any]:
    agent = _agent(ctx)

    def cancel() -> dict[str, Any]:
        todo = _visible(agent, params.task_id)
        try:
            queue.cancel(todo.id, operator=agent.name, reason="tasks/cancel", agent=agent)
        except QueueError as exc:
            # Finished already (the extension allows ending other than cancelled), or not cancellable by
            # this agent's scopes: the acknowledgement is all the extension asks for; the status tells.
            if exc.code == "not_found":
                raise _not_found() from None
        return {"resultType": "complete"}

    return await _run(ctx, cancel)


async def update_task(ctx: ServerRequestContext[Any], params: UpdateTaskParams) -> dict[str, Any]:
    agent = _agent(ctx)

    def update() -> dict[str, Any]:
        todo = _visible(agent, params.task_id)
        answer = params.input_responses.get(_input_key(todo)) if task_status(todo) == "input_required" else None
        # Responses to keys that are not outstanding are ignored, as the extension asks.
        if isinstance(answer, dict):
            action = answer.get("action", "accept")
            content = answer.get("content") if action == "accept" else {"action": str(action)[:100]}
            # Bounded and storable as REST's resolve data is (MAX_PAYLOAD_BYTES, no NUL).
            data = tools._valid(ResolveInput, {"data": content})["data"]
            try:
                # Only an operator or an agent the wait names may answer it (403 -> -32602 below).
                queue.resolve(todo.id, by=agent.name, data=data, agent=agent)
            except QueueError as exc:
                if exc.code == "not_found":
                    raise _not_found() from None
                if exc.code != "conflict":
                    raise
                # Resolved meanwhile (another answer won): the ack stands; tasks/get shows the outcome.
        return {"resultType": "complete"}

    return await _run(ctx, update)


def created_task(body: dict[str, Any]) -> dict[str, Any]:
    """create_for's answer (its structured content) as a CreateTaskResult. The todo is committed, so
    tasks/get finds it; a new todo, or the runnable one holding the key, is working (input_required comes
    only from a wait, later)."""
    todo = body["todo"]
    return {
        "resultType": "task",
        "taskId": todo["id"],
        "status": "working",
        "createdAt": todo["created_at"],
        "lastUpdatedAt": todo["updated_at"],
        "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }


def install(server: Any) -> None:
    server.extensions[EXTENSION] = {}
    server.add_request_handler("tasks/get", TaskIdParams, get_task)
    server.add_request_handler("tasks/cancel", TaskIdParams, cancel_task)
    server.add_request_handler("tasks/update", UpdateTaskParams, update_task)
