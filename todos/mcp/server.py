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
from typing import Any, cast

from django.conf import settings
from django.db import InterfaceError, OperationalError
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import JSONResponse

from switchboard.api import error_body
from todos import auth
from todos.mcp import tasks, tools
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
        title="Switchboard",
        instructions=INSTRUCTIONS,
        # Read directly, so a 2026-07-28 call's header check does not run tools/list each time.
        get_tool_input_schema=lambda name: tool.input_schema if (tool := tools.TOOLS.get(name)) else None,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )
    tasks.install(server)  # todos as MCP Tasks (todos/mcp/tasks.py)
    return server


def _base_url(scope: Scope) -> str:
    headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
    scheme = scope.get("scheme", "http")
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:  # the same trust as Django's request.is_secure()
        name, value = proxy_header
        if headers.get(name.removeprefix("HTTP_").replace("_", "-").lower()) == value:
            scheme = "https"
    host = headers.get("host") or "{}:{}".format(*scope.get("server", ("localhost", 80)))
    return f"{scheme}://{host}"


def _bearer_token(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if kind.lower() == "bearer" and token.strip() else ""
    return None


async def _unauthorized(scope: Scope, receive: Receive, send: Send, *, invalid: bool) -> None:
    # MCP authorization (2025-06-18 on) asks a 401 to point at the protected resource metadata (RFC 9728);
    # RFC 6750 adds error="invalid_token" only when a token was presented.
    challenge = f'Bearer realm="switchboard", resource_metadata="{_base_url(scope)}{RESOURCE_METADATA_PATH}/mcp"'
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
        token = _bearer_token(scope)
        if not token:
            await _unauthorized(scope, receive, send, invalid=token == "")
            return
        try:
            agent = await agent_for_token(token)
        except (OperationalError, InterfaceError):
            body = error_body("unavailable", "The database is unavailable; retry shortly.")
            await JSONResponse(body, status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
            return
        if agent is None:
            await _unauthorized(scope, receive, send, invalid=True)
            return
        await self._manager.handle_request({**scope, AGENT_SCOPE_KEY: agent}, receive, send)


async def resource_metadata(scope: Scope, receive: Receive, send: Send) -> None:
    """RFC 9728 protected resource metadata for /mcp. Tokens are minted by ``manage.py create_agent``, not
    by an OAuth server, so none is named: a client must be given its token."""
    if scope["type"] != "http":
        return
    base = _base_url(scope)
    body = {"resource": f"{base}/mcp", "bearer_methods_supported": ["header"], "resource_name": "Switchboard"}
    await JSONResponse(body)(scope, receive, send)


application = McpEndpoint()
