"""The A2A v1.0 endpoint (issue 33 item 3): ``/a2a`` over JSON-RPC (POST /a2a) and the REST binding
(``/a2a/{queue}/message:send`` ...), and the Agent Card at ``/.well-known/agent-card.json?queue=NAME``.
Both are ASGI apps mounted beside Django (settings.ASGI_MOUNTS), like /mcp: bodies bounded by
switchboard/body_limit.py (DATA_UPLOAD_MAX_MEMORY_SIZE, REST's), Host and Origin checked as /mcp checks them,
the security headers and the request log of switchboard/mounted.py.

One Agent Card per queue: the queue is the card's A2A ``tenant``, which the official clients send with
every request (in JSON-RPC's params, as the REST binding's first path segment). Tokens, scopes and the
per-token request budget are REST's and MCP's (todos/mcp/server.py's lookup).

Waiting costs no thread: ``SendMessage`` (blocking unless ``returnImmediately``), ``SendStreamingMessage``
and ``SubscribeToTask`` wait on the await machinery of todos/results.py (an asyncio event woken by the
listener when the todo finishes, re-read every A2A_STREAM_POLL_SECONDS for a claim, progress or a wait),
each wait one of the agent's await slots. A stream ends when its task finishes or needs input.

Push notifications (todos/a2a/push.py): configs given with a message or added to the caller's own task
(Create/Get/List/DeleteTaskPushNotificationConfig, on both bindings), each SSRF-checked; every change of the
task's state is POSTed to each as a StreamResponse with the config's token, by the notify sidecar.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from django.db import DatabaseError, DataError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import switchboard
from switchboard import dberrors
from switchboard.api import error_body
from switchboard.mounted import CALLER_SCOPE_KEY
from todos import budgets, results, states
from todos.a2a import push, tasks
from todos.a2a.tasks import A2AError
from todos.errors import BudgetExceeded, QueueError
from todos.limits import A2A_STREAM_POLL_SECONDS, LONG_POLL_MAX_SECONDS
from todos.mcp import server as mcp_server
from todos.mcp import tools
from todos.models import QUEUE_NAME_RE, Agent, Todo

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
T = TypeVar("T")

PREFIX = "/a2a"
CARD_PATH = "/.well-known/agent-card.json"
PROTOCOL_VERSION = "1.0"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
STATUS_NAMES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED"}

# The REST binding's routes after /a2a/{queue}: the queue may hold "/" and ":", so the route is matched
# from the right.
REST_ROUTE = re.compile(
    r"^/a2a/(?P<tenant>.+?)/(?:(?P<send>message:send)|(?P<stream>message:stream)|(?P<list>tasks)"
    r"|tasks/(?P<id>td_[A-Za-z0-9_-]+?)(?::(?P<action>cancel|subscribe))?"
    r"|tasks/(?P<pushed>td_[A-Za-z0-9_-]+?)/pushNotificationConfigs(?:/(?P<config>[^/]+))?)$"
)


# --- the Agent Card ---------------------------------------------------------------------------------


def card(base: str, queue: str) -> dict[str, Any]:
    interfaces = [
        {"url": f"{base}{PREFIX}", "protocolBinding": binding, "tenant": queue, "protocolVersion": PROTOCOL_VERSION}
        for binding in ("JSONRPC", "HTTP+JSON")
    ]
    return {
        "name": f"Switchboard queue {queue}",
        "description": f"A message becomes a todo in queue {queue}; an agent claims it, and the task follows it.",
        "supportedInterfaces": interfaces,
        "provider": {"organization": "Switchboard", "url": base},
        "version": switchboard.__version__,
        "capabilities": {"streaming": True, "pushNotifications": True},
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}},
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": [
            {
                "id": "todo",
                "name": "Queue a todo",
                "description": "The message is the todo's payload; its result is the task's artifact.",
                "tags": ["queue", "todo"],
            }
        ],
    }


async def agent_card(scope: Scope, receive: Any, send: Any) -> None:
    """The Agent Card of the queue named by ``?queue=``: public, as A2A cards are; it reads nothing."""
    if scope["type"] != "http":
        return
    base = await mcp_server._checked_base_url(scope, receive, send)
    if base is None:
        return
    queue = Request(scope).query_params.get("queue", "")
    if not QUEUE_NAME_RE.match(queue):
        body = error_body("invalid", "?queue=NAME names the queue whose Agent Card this is.", fields={"queue": []})
        await JSONResponse(body, status_code=400)(scope, receive, send)
        return
    await JSONResponse(card(base, queue))(scope, receive, send)


# --- errors ---------------------------------------------------------------------------------------


def _rpc_error(rpc_id: Any, error: A2AError) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    if error.reason:
        metadata = {key: json.dumps(value) for key, value in (error.detail or {}).items()}
        data.append({"@type": ERROR_INFO, "reason": error.reason, "domain": "a2a-protocol.org", "metadata": metadata})
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if data:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": rpc_id, "error": body}


def _rest_error(error: A2AError) -> dict[str, Any]:
    metadata = {key: json.dumps(value) for key, value in (error.detail or {}).items()}
    details = [{"@type": ERROR_INFO, "reason": error.reason, "domain": "a2a-protocol.org", "metadata": metadata}]
    status = STATUS_NAMES.get(error.status, "INTERNAL")
    return {"error": {"code": error.status, "status": status, "message": error.message, "details": details}}


def _unexpected(exc: Exception) -> A2AError:
    if isinstance(exc, A2AError):
        return exc
    if isinstance(exc, QueueError):
        return tasks.from_queue_error(exc)
    if isinstance(exc, DataError):
        return tasks.invalid("A value cannot be stored (e.g. a NUL character).")
    if isinstance(exc, DatabaseError) and dberrors.error_answer(exc) is not None:
        return A2AError(-32603, 503, "The database is unavailable; retry shortly.", "INTERNAL_ERROR")
    logger.error("a2a: unexpected error", exc_info=exc)
    return A2AError(-32603, 500, "An unexpected error occurred.", "INTERNAL_ERROR")


# --- the operations, on the loop ----------------------------------------------------------------------


async def _pool(work: Callable[[], T]) -> T:
    return await tools.in_thread(work)


async def _settle(agent: Agent, todo: Todo) -> Todo:
    """The todo once it finishes or needs input, or as it is after LONG_POLL_MAX_SECONDS: a blocking
    SendMessage, answered before any proxy's idle timeout."""
    deadline = time.monotonic() + LONG_POLL_MAX_SECONDS
    while not tasks.ends_a_stream(todo) and (left := deadline - time.monotonic()) > 0:
        todo = await results.await_finished(agent, todo.id, min(left, A2A_STREAM_POLL_SECONDS))
    return todo


async def _updates(agent: Agent, todo: Todo, *, at_once: bool = False) -> AsyncIterator[dict[str, Any]]:
    """A stream's StreamResponses: the task, then each change of its status (the result's artifact just
    before completion), until it finishes or needs input; only the task when the message asked to be
    answered at once (``returnImmediately``, which the official client sets when it polls)."""
    yield {"task": tasks.task_of(todo)}
    seen = (todo.state, todo.updated_at)
    while not at_once and not tasks.ends_a_stream(todo):
        todo = await results.await_finished(agent, todo.id, A2A_STREAM_POLL_SECONDS)
        if (todo.state, todo.updated_at) == seen:
            continue
        seen = (todo.state, todo.updated_at)
        if todo.state == "done":
            yield tasks.artifact_update(todo)
        yield tasks.status_update(todo)


def _sse(events: AsyncIterator[dict[str, Any]], wrap: Callable[[dict[str, Any]], dict[str, Any]]) -> Response:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                yield f"data: {json.dumps(wrap(event), separators=(',', ':'))}\n\n".encode()
        except Exception as exc:  # every failure mid-stream is an error event, its text never an exception's
            error = _unexpected(exc)
            yield f"event: error\ndata: {json.dumps(wrap({'__error__': error}))}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _subscribable(agent: Agent, task_id: Any, tenant: str | None) -> Todo:
    todo = await _pool(lambda: tasks.visible(agent, task_id, tenant))
    if states.FINISHED.holds(todo):
        raise A2AError(-32004, 400, "The task has finished: there is nothing to subscribe to.", "UNSUPPORTED_OPERATION")
    return todo


def _returns_at_once(params: dict[str, Any]) -> bool:
    configuration = params.get("configuration")
    return isinstance(configuration, dict) and configuration.get("returnImmediately") is True


# --- JSON-RPC ---------------------------------------------------------------------------------------


async def _jsonrpc(agent: Agent, request: Request) -> Response:
    try:
        envelope = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        return JSONResponse(_rpc_error(None, A2AError(-32700, 400, "Invalid JSON.")))
    if (
        not isinstance(envelope, dict)
        or envelope.get("jsonrpc") != "2.0"
        or not isinstance(envelope.get("method"), str)
    ):
        return JSONResponse(_rpc_error(None, A2AError(-32600, 400, "Not a JSON-RPC 2.0 request.", "INVALID_REQUEST")))
    rpc_id, method, params = envelope.get("id"), envelope["method"], envelope.get("params", {})
    if not isinstance(params, dict):
        return JSONResponse(_rpc_error(rpc_id, tasks.invalid("params must be an object.")))
    tenant = params.get("tenant") if isinstance(params.get("tenant"), str) and params.get("tenant") else None

    def wrap(event: dict[str, Any]) -> dict[str, Any]:
        if "__error__" in event:
            return _rpc_error(rpc_id, event["__error__"])
        return {"jsonrpc": "2.0", "id": rpc_id, "result": event}

    try:
        if method in ("SendMessage", "SendStreamingMessage"):
            todo = await _pool(lambda: tasks.send_message(agent, params, tenant))
            if method == "SendStreamingMessage":
                return _sse(_updates(agent, todo, at_once=_returns_at_once(params)), wrap)
            if not _returns_at_once(params):
                todo = await _settle(agent, todo)
            result: dict[str, Any] = {"task": tasks.task_of(todo)}
        elif method == "GetTask":
            result = tasks.task_of(await _pool(lambda: tasks.visible(agent, params.get("id"), tenant)))
        elif method == "ListTasks":
            result = await _pool(lambda: tasks.list_tasks(agent, params, tenant))
        elif method == "CancelTask":
            result = tasks.task_of(await _pool(lambda: tasks.cancel(agent, params, tenant)))
        elif method == "SubscribeToTask":
            return _sse(_updates(agent, await _subscribable(agent, params.get("id"), tenant)), wrap)
        elif method in PUSH_METHODS:
            operation = PUSH_METHODS[method]
            result = await _pool(lambda: operation(agent, params, tenant))
        elif method == "GetExtendedAgentCard":
            raise A2AError(-32007, 400, "No extended Agent Card is configured.", "EXTENDED_AGENT_CARD_NOT_CONFIGURED")
        else:
            raise A2AError(-32601, 404, "Method not found", "METHOD_NOT_FOUND")
    except Exception as exc:  # each mapped by _unexpected: an unexpected one is logged, its text never sent
        return JSONResponse(_rpc_error(rpc_id, _unexpected(exc)))
    return JSONResponse(wrap(result))


# --- push notification configs (todos/a2a/push.py) -----------------------------------------------------

PUSH_METHODS: dict[str, Callable[[Agent, dict[str, Any], str | None], dict[str, Any]]] = {
    "CreateTaskPushNotificationConfig": push.create,
    "GetTaskPushNotificationConfig": push.get,
    "ListTaskPushNotificationConfigs": push.listed,
    "DeleteTaskPushNotificationConfig": push.delete,
}


async def _push_rest(agent: Agent, request: Request, task_id: str, config_id: str | None, tenant: str) -> Any:
    """POST .../tasks/{id}/pushNotificationConfigs (the body is the config), GET it or one, DELETE one."""
    if request.method == "POST" and config_id is None:
        params = json.loads(await request.body() or b"{}")
        if not isinstance(params, dict):
            raise tasks.invalid("The body must be a JSON object.")
        return await _pool(lambda: push.create(agent, params, tenant, task_id))
    named = {"taskId": task_id, "id": config_id}
    if request.method == "GET":
        return await _pool(lambda: (push.listed if config_id is None else push.get)(agent, named, tenant))
    if request.method == "DELETE" and config_id is not None:
        return await _pool(lambda: push.delete(agent, named, tenant))
    raise A2AError(-32601, 405, "Method not allowed.", "METHOD_NOT_FOUND")


# --- the REST binding ---------------------------------------------------------------------------------


async def _rest(agent: Agent, request: Request) -> Response:
    route = REST_ROUTE.match(request.url.path)
    if route is None:
        return JSONResponse(_rest_error(A2AError(-32601, 404, "Not found", "METHOD_NOT_FOUND")), status_code=404)
    tenant, task_id, action = route["tenant"], route["id"], route["action"]
    post = request.method == "POST"

    def wrap(event: dict[str, Any]) -> dict[str, Any]:
        return _rest_error(event["__error__"]) if "__error__" in event else event

    try:
        if route["send"] or route["stream"]:
            if not post:
                raise A2AError(-32601, 405, "POST only.", "METHOD_NOT_FOUND")
            params = json.loads(await request.body() or b"{}")
            if not isinstance(params, dict):
                raise tasks.invalid("The body must be a JSON object.")
            todo = await _pool(lambda: tasks.send_message(agent, params, tenant))
            if route["stream"]:
                return _sse(_updates(agent, todo, at_once=_returns_at_once(params)), wrap)
            if not _returns_at_once(params):
                todo = await _settle(agent, todo)
            return JSONResponse({"task": tasks.task_of(todo)})
        if route["pushed"]:
            return JSONResponse(await _push_rest(agent, request, route["pushed"], route["config"], tenant))
        if route["list"]:
            query: dict[str, Any] = dict(request.query_params)
            if "pageSize" in query:
                query["pageSize"] = int(query["pageSize"]) if query["pageSize"].isdigit() else -1
            return JSONResponse(await _pool(lambda: tasks.list_tasks(agent, query, tenant)))
        if action == "cancel" and post:
            return JSONResponse(tasks.task_of(await _pool(lambda: tasks.cancel(agent, {"id": task_id}, tenant))))
        if action == "subscribe":
            return _sse(_updates(agent, await _subscribable(agent, task_id, tenant)), wrap)
        if action is None and not post:
            return JSONResponse(tasks.task_of(await _pool(lambda: tasks.visible(agent, task_id, tenant))))
        raise A2AError(-32601, 405, "Method not allowed.", "METHOD_NOT_FOUND")
    except json.JSONDecodeError:
        return JSONResponse(_rest_error(tasks.invalid("Invalid JSON.")), status_code=400)
    except Exception as exc:  # each mapped by _unexpected, as in _jsonrpc
        error = _unexpected(exc)
        return JSONResponse(_rest_error(error), status_code=error.status)


# --- the endpoint -------------------------------------------------------------------------------------


async def _authenticated(scope: Scope, receive: Any, send: Any) -> Agent | None:
    """The caller's Agent, as /mcp finds it (the same tokens, cache and request budget); else the refusal
    is sent and None returned."""
    token = mcp_server._bearer_token(scope)
    challenge = {"WWW-Authenticate": 'Bearer realm="switchboard"'}
    if not token:
        detail = "An agent's token is required: Authorization: Bearer <token>."
        await JSONResponse(error_body("unauthorized", detail), status_code=401, headers=challenge)(scope, receive, send)
        return None
    try:
        agent = await mcp_server.agent_for_token(token)
    except DatabaseError as exc:
        if (answer := dberrors.error_answer(exc)) is None:
            raise
        await JSONResponse(error_body(*answer), status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
        return None
    if agent is None:
        body = error_body("unauthorized", "Invalid or revoked token.")
        await JSONResponse(body, status_code=401, headers=challenge)(scope, receive, send)
        return None
    scope[CALLER_SCOPE_KEY] = agent.name
    try:
        budgets.request_rate.charge(agent)
    except BudgetExceeded as exc:
        retry = {"Retry-After": str(exc.extra["retry_after"])}
        body = error_body(exc.code, exc.detail, **exc.extra)
        await JSONResponse(body, status_code=429, headers=retry)(scope, receive, send)
        return None
    return agent


async def application(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if await mcp_server._checked_base_url(scope, receive, send) is None:
        return
    agent = await _authenticated(scope, receive, send)
    if agent is None:
        return
    request = Request(scope, receive)
    version = request.headers.get("A2A-Version", PROTOCOL_VERSION)
    jsonrpc = request.url.path.rstrip("/") == PREFIX
    if not version.startswith("1."):
        error = A2AError(
            -32009, 400, f"A2A version {version[:20]!r} is not supported: 1.0 is.", "VERSION_NOT_SUPPORTED"
        )
        response: Response = JSONResponse(
            _rpc_error(None, error) if jsonrpc else _rest_error(error), 200 if jsonrpc else 400
        )
    elif jsonrpc:
        if request.method != "POST":
            response = JSONResponse(error_body("invalid", "JSON-RPC is POST /a2a."), status_code=405)
        else:
            response = await _jsonrpc(agent, request)
    else:
        response = await _rest(agent, request)
    await response(scope, receive, send)
