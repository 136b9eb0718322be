"""The agents' queue as MCP tools (SPEC "Interfaces": ``POST /mcp``; issue 12 there, 14 on the tracker).

Each tool validates its arguments with the REST API's own input serializer, makes one call into
todos/queue/ (or a read cut to the caller's scopes) and renders todos with the REST serializer, so a
tool and its REST endpoint take the same values and answer the same JSON. Failures come back as tool
errors whose text is the REST error body (``{"error": {"code", "detail", ...}}``).

Schemas are written by hand and kept small: clients put the whole tool list into every context window
(the list stays under 7 KB, measured in test_mcp_tools).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import DatabaseError, DataError
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from rest_framework import serializers
from rest_framework.utils import encoders

from switchboard import dberrors, executor, ids
from switchboard.api import error_body
from todos import explain, limits, longpoll, queue, results, selectors
from todos.api.batch import batch_parent, valid_batch
from todos.api.serializers import (
    ClaimNextInput,
    ClaimOneInput,
    CompleteInput,
    FailInput,
    HeartbeatInput,
    QueueStatsSerializer,
    ReleaseInput,
    TodoAwaitInput,
    TodoCreateInput,
    TodoListFilter,
    TodoSerializer,
    WaitInput,
    batch_outcomes,
)
from todos.errors import QueueError, TodoNotFound
from todos.limits import (
    DEFAULT_LIST_LIMIT,
    LONG_POLL_MAX_SECONDS,
    MAX_CREATE_BATCH,
    MAX_LIST_LIMIT,
    WAIT_TIMEOUT_MAX_SECONDS,
)
from todos.models import Agent, Todo
from todos.selectors import queue_stats

Args = dict[str, Any]
T = TypeVar("T")
JSONObject = dict[str, Any]


# --- schemas ----------------------------------------------------------------------------------

logger = logging.getLogger(__name__)
_STR = {"type": "string"}
_NUM = {"type": "number"}
_ID = {"type": "string", "description": "td_... id."}
_LEASE_ID = {"type": "string", "description": "Receipt from claim."}
_LEASE_SECONDS = {"type": "number", "description": f"Default {settings.QUEUE_DEFAULT_LEASE_SECONDS}."}

# The todo as TodoSerializer renders it (every REST field is there). Only what an agent needs to act is
# typed, to keep the list small; test_mcp_tools checks these names are REST's.
TODO_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {
        "id": _STR,
        "queue": _STR,
        "state": _STR,
        "payload": {},
        "lease_id": {"type": ["string", "null"]},
        "attempt": {"type": "integer"},
    },
}
_ONE_TODO: JSONObject = {"type": "object", "properties": {"todo": TODO_SCHEMA}, "required": ["todo"]}


def _input(properties: JSONObject, required: tuple[str, ...] = ()) -> JSONObject:
    # No additionalProperties: call() refuses unknown arguments by name, and the list stays smaller.
    schema: JSONObject = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


# --- the calls --------------------------------------------------------------------------------


def _valid(serializer_class: type[serializers.Serializer[Any]], data: Args) -> Args:
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise serializers.ValidationError(serializer.errors)
    return dict(serializer.validated_data)


def _todo_id(args: Args) -> str:
    todo_id = args.pop("id", None)
    if not isinstance(todo_id, str):
        raise serializers.ValidationError({"id": ["A todo id (a string) is required."]})
    if not ids.is_id(todo_id, ids.TODO):
        raise TodoNotFound(f"No todo {todo_id[:40]!r}.")
    return todo_id


def _one(todo: Todo) -> JSONObject:
    return {"todo": TodoSerializer(todo).data}


def watch_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """For a response that streams (SSE): an Event set once the client disconnects, and the task that reads
    ``receive`` until then (cancel it when the stream ends)."""
    gone = asyncio.Event()

    async def read_until_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    return gone, asyncio.get_running_loop().create_task(read_until_disconnect())


async def in_thread(function: Callable[[], T]) -> T:
    """Run ORM work in the web process's pool of threads (switchboard/executor.py). Nothing here goes
    through Django's request handler, so the pool ages and health-checks the thread's connection the way
    the request_started/finished signals would."""
    return await executor.run(function)


async def list_todos(agent: Agent, args: Args) -> JSONObject:
    limit = args.pop("limit", DEFAULT_LIST_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise serializers.ValidationError({"limit": [f"An integer from 1 to {MAX_LIST_LIMIT} is required."]})
    valid = _valid(TodoListFilter, args)
    filters = {field: valid[field] for field in ("queue", "state", "kind") if field in valid}

    def read() -> JSONObject:
        # The caller's scopes cut the rows before any filter, as in the REST list.
        todos = Todo.objects.visible_to(agent).filter(**filters).order_by("-created_at", "-id")[:limit]
        # And the answer stops at a byte budget, as a REST page does (issue 28): whole todos are heavy.
        rows: list[Any] = []
        size, budget = 0, limits.answer_page_max_bytes()
        for todo in todos:
            row = TodoSerializer(todo).data
            size += len(json.dumps(row, cls=encoders.JSONEncoder))
            if rows and size > budget:
                return {"todos": rows, "truncated": True}
            rows.append(row)
        return {"todos": rows}

    return await in_thread(read)


async def get_todo(agent: Agent, args: Args) -> JSONObject:
    todo_id = _todo_id(args)
    wait = _valid(TodoAwaitInput, args)["wait_seconds"]
    todo = await results.await_finished(agent, todo_id, wait)

    def shown() -> JSONObject:
        selectors.show_awaited([todo])
        return _one(todo)

    return await in_thread(shown)


async def claim(agent: Agent, args: Args) -> JSONObject:
    if "id" in args:
        todo_id = _todo_id(args)
        if extra := sorted(set(args) & {"queues", "wait_seconds"}):
            raise serializers.ValidationError({name: ["Not allowed with id."] for name in extra})
        data = _valid(ClaimOneInput, args)
        return await in_thread(lambda: _one(queue.claim(todo_id, agent=agent, **data)))
    data = _valid(ClaimNextInput, args)
    todos = await longpoll.claim_next_waiting(agent=agent, queues=data.pop("queues", None), **data)
    return {"todo": TodoSerializer(todos[0]).data if todos else None}


def _with_receipt(
    transition: Callable[..., Todo], serializer_class: type[serializers.Serializer[Any]]
) -> Callable[[Agent, Args], Awaitable[JSONObject]]:
    async def call(agent: Agent, args: Args) -> JSONObject:
        todo_id = _todo_id(args)
        data = _valid(serializer_class, args)
        if (park := data.pop("park", None)) is not None:  # fail's and release's park (issue 31), as over REST
            data.pop("retry_in_seconds", None)
            return await in_thread(lambda: _one(queue.park(todo_id, agent=agent, **data, **park)))
        return await in_thread(lambda: _one(transition(todo_id, agent=agent, **data)))

    return call


async def heartbeat(agent: Agent, args: Args) -> JSONObject:
    """queue.heartbeat, answering also budget_exhausted (issue 30: its tree has spent its budget: stop)."""
    todo_id = _todo_id(args)
    data = _valid(HeartbeatInput, args)

    def run() -> JSONObject:
        todo = queue.heartbeat(todo_id, agent=agent, **data)
        return {**_one(todo), "budget_exhausted": todo.tree_budget_exhausted}  # type: ignore[attr-defined]

    return await in_thread(run)


async def explain_tool(agent: Agent, args: Args) -> JSONObject:
    """GET /todos/<id>/explain/ with an id, else GET /agents/me/explain/ (todos/explain.py)."""
    queues = args.get("queues")
    if queues is not None and (not isinstance(queues, list) or not all(isinstance(q, str) for q in queues)):
        raise serializers.ValidationError({"queues": ["A list of queue names or globs."]})
    if args.get("id") is not None:
        todo_id = _todo_id(args)
        return await in_thread(lambda: explain.explain_todo(todo_id, agent=agent))
    return await in_thread(lambda: explain.explain_agent(agent, queues=queues))


async def wait(agent: Agent, args: Args) -> JSONObject:
    todo_id = _todo_id(args)
    data = _valid(WaitInput, args)

    def run() -> JSONObject:
        todo, token = queue.wait(
            todo_id,
            agent=agent,
            lease_id=data["lease_id"],
            wait_for=data["for"],
            timeout_seconds=data["timeout_seconds"],
            on_timeout=data["on_timeout"],
            resolvers=data.get("resolvers"),
        )
        body = _one(todo)
        if token is not None:
            # A path on this server (MCP has no request URL to build from); REST answers the full URL.
            body["waitpoint"] = {"token": token, "resolve_url": f"/api/v1/waitpoints/{token}/resolve/"}
        return body

    return await in_thread(run)


async def create_for(agent: Agent, args: Args) -> JSONObject:
    if "todos" in args:
        # A batch, as POST /api/v1/todos/batch/: all or nothing, one {todo, created} per item.
        if extra := sorted(set(args) - {"todos", "parent"}):
            raise serializers.ValidationError({name: ["Not allowed with todos."] for name in extra})
        items, parent = valid_batch(args), batch_parent(args)

        def create_many() -> JSONObject:
            return {"outcomes": batch_outcomes(queue.create_many(items, agent=agent, parent=parent))}

        return await in_thread(create_many)
    data = _valid(TodoCreateInput, args)

    def create() -> JSONObject:
        todo, created = queue.create(agent=agent, **data)
        return {"todo": TodoSerializer(todo).data, "created": created}

    return await in_thread(create)


async def list_queues(agent: Agent, args: Args) -> JSONObject:
    return await in_thread(lambda: {"queues": QueueStatsSerializer(queue_stats(agent), many=True).data})


# --- the list ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: JSONObject
    output_schema: JSONObject
    run: Callable[[Agent, Args], Awaitable[JSONObject]]
    read_only: bool = False

    def describe(self) -> types.Tool:
        annotations = types.ToolAnnotations(read_only_hint=True) if self.read_only else None
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=annotations,
        )


# create_for's arguments, all passed to queue.create through TodoCreateInput: a new create field
# (priority, run_at) is one more entry here once the serializer has it. Terse: the whole tool list must stay
# under 7 KB of JSON (issue 20); the serializer's 400s give the bounds the schema leaves out.
CREATE_FOR_PROPERTIES: JSONObject = {
    "queue": _STR,
    "kind": _STR,
    "title": _STR,
    "payload": {},
    "assignee": _STR,
    "idempotency_key": _STR,  # same key and queue: that todo (the name says it)
    "priority": {"type": "integer", "description": "Lower runs first."},
    "run_at": {"type": "string", "format": "date-time"},  # not before: RFC 3339 with an offset
    "delay_seconds": _NUM,  # not with run_at: a 400 says so
    "fair_key": _STR,  # a fair queue's share: whose todo it is
    "traceparent": _STR,  # W3C Trace Context: the name says it
    "depends_on": {"type": "array", "items": _STR},  # ids to finish first
    "on_dependency_failure": {"enum": ["cancel", "run"]},
    "parent": {"description": "A held todo's {id, lease_id}"},  # its child, as REST's parent
    "spawn_caps": {},  # a root's max_depth, max_children, max_descendants, as REST's
    "callback": {},  # {url, events}: a signed webhook when done or dead-lettered, as REST's
    "children": {},  # "cancel": its finish cancels what is left under it; "keep" (default)
    "budget": {},  # a root's {counter: limit}, as REST's
    "limits": {},  # named limits it is held by, beside its queue's, as REST's (issue 31)
    # Issue 31's create controls, as REST's: a start-by deadline (one of the two), and by idempotency_key
    # supersede (cancel the runnable holder, create anew) or debounce (one todo, run_at moved on).
    "expires_at": {"type": "string", "format": "date-time"},
    "expire_after_seconds": _NUM,
    "supersede": {"type": "boolean"},
    "debounce_seconds": _NUM,
}

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in [
        Tool(
            "list_todos",
            "Todos in your queues, newest first.",
            _input(
                {
                    "queue": _STR,
                    # REST's filter's choices, so a state added there (scheduled, cancelled) is offered here.
                    "state": {"enum": list(cast(serializers.ChoiceField, TodoListFilter().fields["state"]).choices)},
                    "kind": _STR,
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
                }
            ),
            # An answer cut short at the byte budget adds "truncated": true (left out here: the whole tool list
            # must stay under 7 KB, test_mcp_tools.py; the schema allows other properties).
            {"type": "object", "properties": {"todos": {"type": "array", "items": TODO_SCHEMA}}, "required": ["todos"]},
            list_todos,
            read_only=True,
        ),
        Tool(
            "get_todo",
            "One todo; wait_seconds: answer once it finishes.",
            _input(
                {"id": _ID, "wait_seconds": {"type": "number", "minimum": 0, "maximum": LONG_POLL_MAX_SECONDS}}, ("id",)
            ),
            _ONE_TODO,
            get_todo,
            read_only=True,
        ),
        Tool(
            "claim",
            "Lease the next todo of your queues (or id); null if none in wait_seconds. Then heartbeat; complete, "
            "fail or release.",
            _input(
                {
                    "id": _ID,
                    "queues": {"type": "array", "items": _STR, "description": "Names or globs within your scopes."},
                    "lease_seconds": _LEASE_SECONDS,
                    "wait_seconds": {"type": "number", "minimum": 0, "maximum": LONG_POLL_MAX_SECONDS},
                    "worker": _STR,
                }
            ),
            {
                "type": "object",
                "properties": {"todo": {"anyOf": [TODO_SCHEMA, {"type": "null"}]}},
                "required": ["todo"],
            },
            claim,
        ),
        Tool(
            "heartbeat",
            "Extend your lease (each third of it); optional progress, checkpoint, usage.",
            _input(
                {
                    "id": _ID,
                    "lease_id": _LEASE_ID,
                    "lease_seconds": _LEASE_SECONDS,
                    "progress": {"type": "object", "properties": {"percent": _NUM, "message": _STR}},
                    "checkpoint": {"type": "object"},
                    "usage": {},
                },
                ("id", "lease_id"),
            ),
            _ONE_TODO,
            heartbeat,
        ),
        Tool(
            "complete",
            "Finish a leased todo with a JSON result.",
            _input({"id": _ID, "lease_id": _LEASE_ID, "result": {}, "usage": {}}, ("id", "lease_id")),
            _ONE_TODO,
            _with_receipt(queue.complete, CompleteInput),
        ),
        Tool(
            "fail",
            "Fail a leased todo: retried (backoff or retry_in_seconds) until attempts run out.",
            _input({"id": _ID, "lease_id": _LEASE_ID, "error": _STR, "retry_in_seconds": _NUM}, ("id", "lease_id")),
            _ONE_TODO,
            _with_receipt(queue.fail, FailInput),
        ),
        Tool(
            "release",
            "Hand a leased todo back; costs no attempt.",
            _input({"id": _ID, "lease_id": _LEASE_ID}, ("id", "lease_id")),
            _ONE_TODO,
            _with_receipt(queue.release, ReleaseInput),
        ),
        Tool(
            "wait",
            "Give the lease back until for resolves: {todos:[ids]}, {event:{source,type,match}}, {token:true}, "
            "{people:{users,groups,...}} or a resolver.",
            _input(
                {
                    "id": _ID,
                    "lease_id": _LEASE_ID,
                    "for": {"type": "object"},
                    "timeout_seconds": {"type": "number", "maximum": WAIT_TIMEOUT_MAX_SECONDS},
                    "on_timeout": {"enum": ["pending", "fail"]},
                    "resolvers": {"type": "array"},
                },
                ("id", "lease_id", "for", "timeout_seconds"),
            ),
            {"type": "object", "properties": {"todo": TODO_SCHEMA, "waitpoint": {"type": "object"}}},
            wait,
        ),
        Tool(
            "create_for",
            f"Create a todo in your scopes, or todos: up to {MAX_CREATE_BATCH}, all or none.",
            _input({**CREATE_FOR_PROPERTIES, "todos": {"type": "array", "items": {"type": "object"}}}),
            {
                "type": "object",
                "properties": {"todo": TODO_SCHEMA, "created": {"type": "boolean"}, "outcomes": {"type": "array"}},
            },
            create_for,
        ),
        Tool(
            "explain",
            "Why id is not claimed; no id: why your claims get none.",
            _input({"id": _ID, "queues": {}}),
            {"type": "object"},
            explain_tool,
            read_only=True,
        ),
        Tool(
            "list_queues",
            "Your queues: counts by state, oldest pending age.",
            _input({}),
            {"type": "object", "properties": {"queues": {"type": "array"}}, "required": ["queues"]},
            list_queues,
            read_only=True,
        ),
    ]
}


def tool_result(body: JSONObject) -> types.CallToolResult:
    # The same JSON as text too: clients of the 2025-03-26 revision and older read only content.
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=body)


def error_result(body: JSONObject) -> types.CallToolResult:
    """A tool error: the REST error body as the text content, and no structuredContent. Structured
    content must match the tool's output schema, which describes success; clients that validate it
    (the TypeScript SDK 1.x, the Inspector) turned ``{"error": ...}`` there into -32602 and hid the
    code, so an agent could not tell a lost lease from a typo."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _invalid(fields: Any) -> JSONObject:
    return error_body("invalid", "The arguments are invalid.", fields=fields)


Runner = Callable[[Agent, Args], Awaitable[JSONObject]]


async def call(name: str, agent: Agent, arguments: Args | None, *, run: Runner | None = None) -> types.CallToolResult:
    """Run one tool for ``agent``; every anticipated failure is a tool error with the REST error body.
    An unknown tool is not a tool's failure but a bad request: a JSON-RPC error (-32602), as the spec
    asks. ``run`` replaces the tool's own function with one taking the same arguments (a task-augmented
    create_for, todos/mcp/tasks_2025.py)."""
    tool = TOOLS.get(name)
    if tool is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name[:100]}")
    args = dict(arguments or {})
    if unknown := sorted(set(args) - set(tool.input_schema["properties"])):
        return error_result(_invalid({key: ["Unknown argument."] for key in unknown}))
    try:
        return tool_result(await (run or tool.run)(agent, args))
    except serializers.ValidationError as exc:
        return error_result(_invalid(exc.detail))
    except QueueError as exc:
        return error_result(error_body(exc.code, exc.detail, **exc.extra))
    except DataError:
        # A value PostgreSQL refuses (a NUL character) that no serializer caught: bad input, not a crash.
        logger.warning("mcp tool %s: the database refused a value", name, exc_info=True)
        return error_result(error_body("invalid", "A value cannot be stored (e.g. a NUL character)."))
    except MCPError:
        raise
    except DatabaseError as exc:
        if (answer := dberrors.error_answer(exc)) is None:
            logger.exception("mcp tool %s: unexpected database error", name)
            return error_result(error_body("internal", "An unexpected error occurred."))
        return error_result(error_body(*answer))
    except Exception:
        # A bug: the cause goes to the log, the agent gets REST's 500 body, never the exception's own text.
        logger.exception("mcp tool %s: unexpected error", name)
        return error_result(error_body("internal", "An unexpected error occurred."))
