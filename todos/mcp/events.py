"""MCP Events (issue 33 item 2): the ``io.modelcontextprotocol/events`` extension (SEP-3415, grown from the
design sketch of modelcontextprotocol/experimental-ext-triggers-events), over todos/event_feed.py.

* ``initialize`` (and 2026-07-28's ``server/discover``): a client that declares the extension
  (``capabilities.extensions``, or the request's own client capabilities) is answered with it, and with the
  sketch's ``capabilities.events`` (``listChanged: false``: the event types are fixed).
  The server is stateless (todos/mcp/server.py), so the events/* methods answer any authenticated agent.
* ``events/list``: todo.ready, todo.finished, wait.resolved, each with poll, push and webhook.
* ``events/poll``: a long poll of one subscription (``timeoutMs`` at most LONG_POLL_MAX_SECONDS), re-read
  every EVENTS_RECHECK_SECONDS on the loop (each read in the pool, no thread held while it waits; one of the
  agent's await slots while held).
* ``events/stream``: push, a POST answered with an SSE stream (served by ``stream`` from
  todos/mcp/server.py, before the SDK): ``notifications/events/active``, then ``.../event`` and
  ``.../heartbeat`` with the cursor, until the client hangs up.
* ``events/subscribe`` / ``events/unsubscribe``: webhooks, stored durably (EventSubscription) and sent by
  the notify sidecar through todos/notices.py (Standard Webhooks, SSRF-guarded).

Errors are the sketch's: -32602 invalid params (``data.field`` names the field), -32011 NotFound,
-32012 Forbidden, -32013 ResourceExhausted, -32015 CallbackEndpointError (``data.reason`` a category).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from typing import Any

from django.db import DatabaseError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS

from switchboard import dberrors
from switchboard.api import error_body
from todos import budgets, event_feed
from todos.errors import BudgetExceeded
from todos.event_feed import FeedError, Position
from todos.limits import (
    EVENTS_DEFAULT_MAX_EVENTS,
    EVENTS_HEARTBEAT_SECONDS,
    EVENTS_MAX_EVENTS,
    EVENTS_NEXT_POLL_MS,
    EVENTS_POLL_TIMEOUT_MAX_MS,
    EVENTS_RECHECK_SECONDS,
)
from todos.mcp import tasks, tools
from todos.models import Agent

logger = logging.getLogger(__name__)

EXTENSION = "io.modelcontextprotocol/events"
SUBSCRIPTION_META = "io.modelcontextprotocol/subscriptionId"
NOT_FOUND, FORBIDDEN, EXHAUSTED, CALLBACK_ENDPOINT_ERROR = -32011, -32012, -32013, -32015
METHODS = ("events/list", "events/poll", "events/subscribe", "events/unsubscribe")


def _declares(params: dict[str, Any]) -> bool:
    capabilities = params.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def _declares_per_request(ctx: ServerRequestContext[Any]) -> bool:
    """A 2026-07-28 request's own client capabilities (its ``_meta`` envelope) declare the extension."""
    capabilities = (ctx.meta or {}).get(CLIENT_CAPABILITIES_META_KEY)
    return isinstance(capabilities, dict) and _declares({"capabilities": capabilities})


def _error(exc: Exception) -> MCPError:
    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, FeedError):
        code = {"invalid": INVALID_PARAMS, "forbidden": FORBIDDEN, "not_found": NOT_FOUND}[exc.kind]
        data: dict[str, Any] = {
            "field": exc.field,
            **error_body(exc.kind, exc.detail, fields={exc.field: [exc.detail]}),
        }
        if exc.kind == "not_found":
            data["kind"] = "event"
        return MCPError(code=code, message=exc.detail, data=data)
    if isinstance(exc, event_feed.ResourceExhausted):
        return MCPError(
            code=EXHAUSTED,
            message=f"At most {exc.most} webhook subscriptions per agent.",
            data={"limit": "subscriptions", "max": exc.most},
        )
    if isinstance(exc, event_feed.CallbackEndpointError):
        return MCPError(
            code=CALLBACK_ENDPOINT_ERROR,
            message="The callback endpoint failed verification or could not be reached.",
            data={"reason": exc.reason},
        )
    if isinstance(exc, BudgetExceeded):
        return MCPError(code=EXHAUSTED, message=exc.detail, data={"limit": "waits", **exc.extra})
    if isinstance(exc, DatabaseError) and dberrors.error_answer(exc) is not None:
        return MCPError(code=INTERNAL_ERROR, message="The database is unavailable; retry shortly.")
    logger.error("events: unexpected error", exc_info=exc)
    return MCPError(code=INTERNAL_ERROR, message="An unexpected error occurred.")


def _int(params: dict[str, Any], name: str, default: int, most: int) -> int:
    value = params.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FeedError("invalid", f"{name} must be a non-negative integer.", field=name)
    return min(value, most)


def _max_age(params: dict[str, Any]) -> Any:
    value = params.get("maxAgeMs")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise FeedError("invalid", "maxAgeMs must be a non-negative integer.", field="maxAgeMs")
    return value


def _begin(agent: Agent, params: dict[str, Any]) -> tuple[event_feed.Subscription, Position, bool]:
    """Check a poll's or a stream's (name, arguments, cursor, maxAgeMs): where it starts, and truncated."""
    sub = event_feed.check(agent, params.get("name"), params.get("arguments"))
    position = event_feed.decode_cursor(params.get("cursor"))
    max_age = _max_age(params)
    now = event_feed.watermark()
    begin, truncated = event_feed.start(position, max_age, now)
    return sub, begin, truncated


async def poll(agent: Agent, params: dict[str, Any]) -> dict[str, Any]:
    limit = _int(params, "maxEvents", EVENTS_DEFAULT_MAX_EVENTS, EVENTS_MAX_EVENTS) or 1
    timeout_ms = _int(params, "timeoutMs", 0, EVENTS_POLL_TIMEOUT_MAX_MS)
    _, begin, truncated = await tools.in_thread(lambda: _begin(agent, params))
    answer: dict[str, Any] = {"events": [], "cursor": begin.encode(), "truncated": truncated, "hasMore": False}
    if params.get("cursor") is None:  # null: start from now, no events
        return {**answer, "nextPollMs": EVENTS_NEXT_POLL_MS}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    with budgets.wait_slots.slot(agent):
        while True:
            # The agent is read afresh on every re-read, as a push stream's is: one deactivated or whose
            # scopes no longer cover the subscription mid-wait is answered -32012 at once, not with events.
            batch = await tools.in_thread(functools.partial(_reread, agent.pk, params, begin, limit))
            if batch.events or loop.time() >= deadline:
                break
            begin = event_feed.decode_cursor(batch.cursor) or begin
            await asyncio.sleep(min(EVENTS_RECHECK_SECONDS, max(0.0, deadline - loop.time())))
    return {
        "events": batch.events,
        "cursor": batch.cursor,
        "truncated": truncated or batch.truncated,
        "hasMore": batch.has_more,
        "nextPollMs": EVENTS_NEXT_POLL_MS,
    }


async def subscribe(agent: Agent, params: dict[str, Any]) -> dict[str, Any]:
    delivery = params.get("delivery")
    if not isinstance(delivery, dict):
        raise FeedError("invalid", "delivery must be an object {mode, url, secret}.", field="delivery")
    if delivery.get("mode", "webhook") != "webhook":
        raise MCPError(
            code=-32014,
            message="events/subscribe is for webhook delivery only.",
            data={"feature": "deliveryMode", "value": str(delivery.get("mode"))[:20]},
        )

    def run() -> dict[str, Any]:
        sub = event_feed.check(agent, params.get("name"), params.get("arguments"))
        secret = event_feed.check_secret(delivery.get("secret"))
        url = event_feed.check_url(delivery.get("url"))
        ttl = event_feed.granted_ttl(params.get("ttlMs"), "ttlMs" in params)
        cursor = event_feed.decode_cursor(params.get("cursor"))
        key = event_feed.subscription_id(agent, url, sub.name, sub.arguments)
        event_feed.check_cap(agent, key)
        event_feed.verify_endpoint(agent, url, secret, key)
        return event_feed.subscribe(sub, url=url, secret=secret, cursor=cursor, max_age_ms=_max_age(params), ttl=ttl)

    return await tools.in_thread(run)


async def unsubscribe(agent: Agent, params: dict[str, Any]) -> dict[str, Any]:
    delivery = params.get("delivery")
    url = delivery.get("url") if isinstance(delivery, dict) else None
    gone = await tools.in_thread(
        lambda: event_feed.unsubscribe(agent, url, params.get("name"), params.get("arguments"))
    )
    if not gone:
        raise MCPError(code=NOT_FOUND, message="No such subscription.", data={"kind": "subscription"})
    return {}


async def middleware(ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
    if ctx.method in ("initialize", "server/discover"):
        result = await call_next(ctx)
        declared = _declares(dict(ctx.params or {})) or _declares_per_request(ctx)
        if isinstance(result, dict) and declared:
            capabilities = dict(result.get("capabilities", {}))
            capabilities["extensions"] = {**capabilities.get("extensions", {}), EXTENSION: {}}
            capabilities["events"] = {"listChanged": False}
            result["capabilities"] = capabilities
        return result
    if ctx.method not in METHODS:
        return await call_next(ctx)
    agent = tasks._agent(ctx)
    params = dict(ctx.params or {})
    try:
        if ctx.method == "events/list":
            return {"events": event_feed.EVENT_TYPES}
        if ctx.method == "events/poll":
            return await poll(agent, params)
        if ctx.method == "events/subscribe":
            return await subscribe(agent, params)
        return await unsubscribe(agent, params)
    except Exception as exc:
        raise _error(exc) from None


def install(server: Any) -> None:
    server.middleware.append(middleware)


# --- events/stream: a POST answered with an SSE stream (todos/mcp/server.py hands it here) ---------------


def _reread(agent_pk: int, params: dict[str, Any], begin: Position, limit: int = EVENTS_MAX_EVENTS) -> event_feed.Batch:
    """A held poll's or a push stream's re-read, with the agent read afresh (one primary-key read): a
    deactivated agent, or one whose scopes no longer cover the subscription, is refused (FeedError), which
    answers the poll -32012 or ends the stream."""
    agent = Agent.objects.filter(pk=agent_pk, is_active=True).first()
    if agent is None:
        raise FeedError("forbidden", "The agent was deactivated.", field="name")
    sub = event_feed.check(agent, params.get("name"), params.get("arguments"))
    return event_feed.read(sub, begin, limit)


def _frame(message: dict[str, Any]) -> bytes:
    return f"event: message\ndata: {json.dumps(message, separators=(',', ':'))}\n\n".encode()


async def stream(agent: Agent, message: dict[str, Any], receive: Any, send: Any) -> None:
    """Serve one ``events/stream`` request: a JSON-RPC error at once if the subscription is refused, else an
    SSE stream of its notifications until the client hangs up (one of the agent's await slots meanwhile)."""
    request_id = message.get("id")
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    assert isinstance(params, dict)
    meta = {SUBSCRIPTION_META: request_id}

    async def refuse(error: MCPError) -> None:
        body = json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "error": error.error.model_dump(mode="json", exclude_none=True)}
        ).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    try:
        _, begin, truncated = await tools.in_thread(lambda: _begin(agent, params))
        slot = budgets.wait_slots.slot(agent)
        slot.__enter__()
    except Exception as exc:
        await refuse(_error(exc))
        return
    gone, watcher = tools.watch_disconnect(receive)
    try:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        active = {"cursor": begin.encode(), "truncated": truncated, "_meta": meta}
        await send(
            {
                "type": "http.response.body",
                "body": _frame({"jsonrpc": "2.0", "method": "notifications/events/active", "params": active}),
                "more_body": True,
            }
        )
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while not gone.is_set():
            try:
                batch = await tools.in_thread(functools.partial(_reread, agent.pk, params, begin))
            except FeedError as exc:  # the token was revoked or the scope taken away: the stream ends
                error = {"code": FORBIDDEN, "message": "Forbidden", "data": {"reason": exc.detail}}
                end = _frame(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/events/terminated",
                        "params": {"error": error, "_meta": meta},
                    }
                )
                end += _frame({"jsonrpc": "2.0", "id": request_id, "result": {"_meta": {}}})
                await send({"type": "http.response.body", "body": end, "more_body": False})
                return
            except DatabaseError:
                logger.warning("events: a push re-read failed; trying again", exc_info=True)
                batch = None
            chunks = b""
            if batch is not None:
                begin = event_feed.decode_cursor(batch.cursor) or begin
                for event in batch.events:
                    note = {**event, "cursor": batch.cursor, "_meta": meta}
                    chunks += _frame({"jsonrpc": "2.0", "method": "notifications/events/event", "params": note})
                if batch.truncated:
                    gap = {"cursor": batch.cursor, "truncated": True, "_meta": meta}
                    chunks += _frame({"jsonrpc": "2.0", "method": "notifications/events/active", "params": gap})
            if chunks or loop.time() - quiet_since >= EVENTS_HEARTBEAT_SECONDS:
                if not chunks:
                    beat = {"cursor": begin.encode(), "_meta": meta}
                    chunks = _frame({"jsonrpc": "2.0", "method": "notifications/events/heartbeat", "params": beat})
                quiet_since = loop.time()
                await send({"type": "http.response.body", "body": chunks, "more_body": True})
            if not (batch is not None and batch.has_more):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), timeout=EVENTS_RECHECK_SECONDS)
    except OSError:
        pass  # the client went away mid-send
    finally:
        watcher.cancel()
        slot.__exit__(None, None, None)
