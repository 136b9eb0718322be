"""The MCP endpoint: the official SDK's streamable-HTTP transport, stateless, mounted at /mcp by
switchboard/asgi.py (settings.ASGI_MOUNTS), behind the agents' bearer tokens.

Stateless because every web process must be able to answer any request: no session lives between
two POSTs, so nothing ties an agent to one process. Both protocol eras are served by the SDK: the
2025 revisions (initialize handshake, ``MCP-Protocol-Version`` header) and 2026-07-28 (a per-request
envelope). The token is checked here, before the SDK sees the request, and the Agent rides in the ASGI
scope to the tool handler.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any, cast
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError
from django.utils.http import is_same_domain
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import JSONResponse

import switchboard
from switchboard import dberrors
from switchboard.api import error_body
from switchboard.mounted import CALLER_SCOPE_KEY
from todos import auth, budgets
from todos.errors import BudgetExceeded
from todos.mcp import events, tasks, tasks_2025, tools
from todos.models import Agent, hash_token

Scope = dict[str, Any]
Receive = Any
Send = Any

AGENT_SCOPE_KEY = "switchboard.agent"
RESOURCE_METADATA_PATH = "/.well-known/oauth-protected-resource"

INSTRUCTIONS = (
    "Switchboard is a work queue. Claim a todo, heartbeat every third of its lease, then complete or fail "
    "it. Never act on a todo without holding its lease."
)


async def agent_for_token(token: str) -> Agent | None:
    """The active Agent holding ``token``, or None: REST's own lookup (by hash, with its cache), so MCP
    and REST accept exactly the same tokens. The one place MCP reaches it; repoint it if it moves."""
    return await tools.in_thread(lambda: auth.token_cache.active_agent(hash_token(token)))


async def _list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[tool.describe() for tool in tools.TOOLS.values()])


async def _call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    agent = ctx.request.scope.get(AGENT_SCOPE_KEY) if ctx.request is not None else None
    if not isinstance(agent, Agent):  # cannot happen behind McpEndpoint; refuse rather than act as nobody
        return tools.error_result(error_body("unauthorized", "No agent."))
    result = await tools.call(params.name, agent, params.arguments)
    if params.name == "create_for" and not result.is_error and tasks.declares_tasks(ctx):
        # The extension's resultType: the SDK passes an extension's shape through as the handler gives it.
        return cast(types.CallToolResult, tasks.created_task(result.structured_content or {}))
    return result


def build_server() -> Server[Any]:
    server: Server[Any] = Server(
        "switchboard",
        version=switchboard.__version__,
        title="Switchboard",
        instructions=INSTRUCTIONS,
        # Read directly, so a 2026-07-28 call's header check does not run tools/list each time.
        get_tool_input_schema=lambda name: tool.input_schema if (tool := tools.TOOLS.get(name)) else None,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )
    tasks.install(server)  # todos as MCP Tasks (todos/mcp/tasks.py)
    tasks_2025.install(server)  # and on the 2025-11-25 wire (todos/mcp/tasks_2025.py)
    events.install(server)  # MCP Events (todos/mcp/events.py)
    return server


def _origin_allowed(request: ASGIRequest, base: str) -> bool:
    """A browser's Origin, when one is sent, read as Django's CSRF check reads it: this server's own origin
    (scheme, host and port, as the request reached it) or one of CSRF_TRUSTED_ORIGINS
    (``https://*.example.com`` covering subdomains). A host name alone is not an origin: another server on
    the same host (a dev server on http://localhost:3000) or the other scheme is refused; the MCP
    Inspector's page is let in by naming its origin in CSRF_TRUSTED_ORIGINS. A DNS-rebound page carries
    its own foreign origin."""
    origin = request.META.get("HTTP_ORIGIN")
    if origin is None:  # not a browser: nothing can have been rebound
        return True
    if origin.lower() == base.lower() or origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return False  # "null" (a sandboxed frame, a file) and the like
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = urlsplit(trusted)
        if "*" in trusted and wildcard.scheme == parsed.scheme:
            if is_same_domain(parsed.netloc, wildcard.netloc.lstrip("*")):
                return True
    return False


async def _checked_base_url(scope: Scope, receive: Receive, send: Send) -> str | None:
    """``scheme://host`` of this request when its Host (or X-Forwarded-Host, if USE_X_FORWARDED_HOST) is
    one of ALLOWED_HOSTS and its Origin, if any, is allowed; else the refusal is sent and None returned.

    /mcp is mounted beside Django, not behind it, so Django's host check never runs here: this is it,
    with Django's own reading of the headers (scheme from SECURE_PROXY_SSL_HEADER too). Without it a
    forged Host reached the tools and was echoed back in the 401 challenge and the resource document,
    and a page whose name was rebound to this server could call the tools from a browser."""
    request = ASGIRequest(scope, io.BytesIO())
    try:
        base = f"{request.scheme}://{request.get_host()}"
    except DisallowedHost:
        refusal = JSONResponse(
            error_body("invalid", "The Host header names no host this server answers to (ALLOWED_HOSTS)."),
            status_code=400,
        )
        await refusal(scope, receive, send)
        return None
    if not _origin_allowed(request, base):
        refusal = JSONResponse(error_body("forbidden", "Requests from this Origin are not allowed."), status_code=403)
        await refusal(scope, receive, send)
        return None
    return base


def _bearer_token(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if kind.lower() == "bearer" and token.strip() else ""
    return None


async def _unauthorized(scope: Scope, receive: Receive, send: Send, *, base: str, invalid: bool) -> None:
    # MCP authorization (2025-06-18 on) asks a 401 to point at the protected resource metadata (RFC 9728);
    # RFC 6750 adds error="invalid_token" only when a token was presented.
    challenge = f'Bearer realm="switchboard", resource_metadata="{base}{RESOURCE_METADATA_PATH}/mcp"'
    if invalid:
        challenge += ', error="invalid_token"'
    detail = "Invalid or revoked token." if invalid else "An agent's token is required: Authorization: Bearer <token>."
    response = JSONResponse(
        error_body("unauthorized", detail), status_code=401, headers={"WWW-Authenticate": challenge}
    )
    await response(scope, receive, send)


class McpEndpoint:
    """The ASGI app at /mcp. ``startup``/``shutdown`` run the SDK's session manager (its task group
    serves every request), called by switchboard/asgi.py on the lifespan events."""

    def __init__(self) -> None:
        self.server = build_server()
        self._stack: contextlib.AsyncExitStack | None = None
        self._manager: StreamableHTTPSessionManager | None = None

    async def startup(self) -> None:
        # A session manager runs once; a fresh one per start lets tests start and stop the endpoint.
        self._manager = StreamableHTTPSessionManager(
            app=self.server,
            stateless=True,
            # One JSON answer per POST: the tools send no progress or server requests mid-call.
            json_response=True,
            # REST's request size limit, so a body the API refuses is refused here too.
            max_request_body_size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
        )
        self._stack = contextlib.AsyncExitStack()
        await self._stack.enter_async_context(self._manager.run())

    async def shutdown(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
        self._stack = self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self._manager is None:
            response = JSONResponse(
                error_body("unavailable", "The MCP endpoint is not running: the ASGI server sent no lifespan startup."),
                status_code=503,
            )
            await response(scope, receive, send)
            return
        base = await _checked_base_url(scope, receive, send)
        if base is None:
            return
        token = _bearer_token(scope)
        if not token:
            await _unauthorized(scope, receive, send, base=base, invalid=token == "")
            return
        try:
            agent = await agent_for_token(token)
        except DatabaseError as exc:
            if (answer := dberrors.error_answer(exc)) is None:
                raise
            await JSONResponse(error_body(*answer), status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
            return
        if agent is None:
            await _unauthorized(scope, receive, send, base=base, invalid=True)
            return
        scope[CALLER_SCOPE_KEY] = agent.name  # for the request's log line (switchboard/mounted.py)
        try:
            budgets.request_rate.charge(agent)
        except BudgetExceeded as exc:
            retry = {"Retry-After": str(exc.extra["retry_after"])}
            await JSONResponse(error_body(exc.code, exc.detail, **exc.extra), status_code=429, headers=retry)(
                scope, receive, send
            )
            return
        if tasks_2025.wants_status_stream(scope):
            # The 2025-11-25 wire's listening client: task status notifications (todos/mcp/tasks_2025.py).
            await tasks_2025.status_stream(agent, scope, receive, send)
            return
        if scope.get("method") == "POST":
            # events/stream answers a POST with an SSE stream, which the SDK's JSON-answering transport
            # cannot: the body is read here (bounded as the SDK bounds it), and handed on unchanged otherwise.
            body, receive = await _buffered(receive)
            message = _json_object(body)
            if message is not None and message.get("method") == "events/stream":
                await events.stream(agent, message, receive, send)
                return
        await self._manager.handle_request({**scope, AGENT_SCOPE_KEY: agent}, receive, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body (up to one byte over DATA_UPLOAD_MAX_MEMORY_SIZE, which the SDK then refuses), and a
    ``receive`` that replays it before the rest."""
    chunks: list[bytes] = []
    size, more = 0, True
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0) + 1
    while more and size < limit:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), _replay([message], receive)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = bool(message.get("more_body"))
    body = b"".join(chunks)
    return body, _replay([{"type": "http.request", "body": body, "more_body": more}], receive)


def _replay(first: list[dict[str, Any]], receive: Receive) -> Receive:
    pending = list(first)

    async def replayed() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        message: dict[str, Any] = await receive()
        return message

    return replayed


def _json_object(body: bytes) -> dict[str, Any] | None:
    if b"events/stream" not in body:  # the common case: no parse
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def resource_metadata(scope: Scope, receive: Receive, send: Send) -> None:
    """RFC 9728 protected resource metadata for /mcp. Tokens are minted by ``manage.py create_agent``, not
    by an OAuth server, so none is named: a client must be given its token."""
    if scope["type"] != "http":
        return
    base = await _checked_base_url(scope, receive, send)
    if base is None:
        return
    body = {"resource": f"{base}/mcp", "bearer_methods_supported": ["header"], "resource_name": "Switchboard"}
    await JSONResponse(body)(scope, receive, send)


application = McpEndpoint()
