#!/usr/bin/env python3
"""A push hint for Claude Code: a local stdio MCP server that says when work arrives in your queues.

    claude mcp add switchboard-channel -e SWITCHBOARD_URL=https://HOST -e SWITCHBOARD_TOKEN=sb_... \\
        -- python examples/mcp_channel.py --queues jobs
    claude --dangerously-load-development-channels server:switchboard-channel

It declares Claude Code's experimental ``claude/channel`` capability (a research preview: custom
channels need the flag above) and sends ``notifications/claude/channel`` when pending todos it has
not seen before appear in the agent's queues. It only reads (``GET /api/v1/todos/?state=pending``,
the agent's own token and scopes): it never claims, so it cannot take work from anyone. A
notification is a hint to call the ``claim`` tool of the Switchboard MCP server; the queue stays the
ledger, and a hint that arrives late, twice or not at all changes nothing.

Needs the ``mcp`` SDK (2.x) and ``requests``.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import os
import sys
from collections import Counter
from typing import Any

import anyio
import requests
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCNotification

# stdout is the MCP stream: logs go to stderr.
log = logging.getLogger("mcp_channel")

CHANNEL = "claude/channel"
NOTIFICATION = "notifications/claude/channel"
INSTRUCTIONS = (
    "Messages from this channel say that new todos are pending in your Switchboard queues. They are "
    "hints, not work: claim a todo with the switchboard server's claim tool before acting on anything."
)


class PendingWatcher:
    """Remembers which pending todos it has announced; ``poll`` returns the new ones, per queue."""

    def __init__(self, url: str, token: str, queues: list[str], timeout: float = 10.0) -> None:
        self.url = url.rstrip("/") + "/api/v1/todos/"
        self.queues = queues
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.seen: set[str] = set()

    def wanted(self, queue: str) -> bool:
        return not self.queues or any(fnmatch.fnmatchcase(queue, pattern) for pattern in self.queues)

    def poll(self) -> Counter[str]:
        # Newest first: one page holds whatever arrived since the last poll unless a burst beat it.
        response = self.session.get(self.url, params={"state": "pending", "page_size": "100"}, timeout=self.timeout)
        response.raise_for_status()
        pending = [t for t in response.json()["results"] if self.wanted(t["queue"])]
        new = Counter(t["queue"] for t in pending if t["id"] not in self.seen)
        # Forget what is no longer pending, so the set stays the size of one page.
        self.seen = {t["id"] for t in pending}
        return new


def message(new: Counter[str]) -> dict[str, Any]:
    parts = [f"{count} in {queue}" for queue, count in sorted(new.items())]
    return {
        "content": f"New Switchboard todos pending: {', '.join(parts)}. Claim one with the claim tool to work on it.",
        "meta": {"queues": ",".join(sorted(new)), "count": str(sum(new.values()))},
    }


async def watch(watcher: PendingWatcher, send: Any, initialized: anyio.Event, interval: float) -> None:
    await initialized.wait()  # nothing may be pushed before the client has finished initializing
    while True:
        try:
            new = await anyio.to_thread.run_sync(watcher.poll)
        except (requests.RequestException, ValueError, KeyError) as exc:
            log.warning("poll failed (%s); retrying in %.0f s", exc.__class__.__name__, interval)
        else:
            if new:
                params = message(new)
                await send(SessionMessage(JSONRPCNotification(jsonrpc="2.0", method=NOTIFICATION, params=params)))
        await anyio.sleep(interval)


async def serve(watcher: PendingWatcher, interval: float) -> None:
    server: Server[Any] = Server("switchboard-channel", instructions=INSTRUCTIONS)
    initialized = anyio.Event()

    async def on_initialized(ctx: Any, params: types.NotificationParams) -> None:
        initialized.set()

    server.add_notification_handler("notifications/initialized", types.NotificationParams, on_initialized)
    options = server.create_initialization_options(experimental_capabilities={CHANNEL: {}})
    async with stdio_server() as (read_stream, write_stream), anyio.create_task_group() as tasks:
        tasks.start_soon(watch, watcher, write_stream.send, initialized, interval)
        await server.run(read_stream, write_stream, options)
        tasks.cancel_scope.cancel()  # the client closed stdin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SWITCHBOARD_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--queues", default="", help="comma-separated names or globs (default: every visible queue)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    args = parser.parse_args(argv)
    token = os.environ.get("SWITCHBOARD_TOKEN")
    if not token:
        parser.error("set SWITCHBOARD_TOKEN to the agent's token")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    anyio.run(serve, PendingWatcher(args.url, token, queues), args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
