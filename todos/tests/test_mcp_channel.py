"""examples/mcp_channel.py, the push hint: an MCP stdio client (the official SDK's) starts it against the
live server and reads its ``notifications/claude/channel`` messages."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import pytest
from django.db import connection
from mcp import Client, StdioServerParameters
from mcp.client import ClientExtension
from mcp.client.extension import NotificationBinding
from pydantic import BaseModel

from todos import queue
from todos.models import Todo, TodoState
from todos.tests.mcp_live import ROOT, mcp_base

__all__ = ["mcp_base"]

pytestmark = pytest.mark.django_db(transaction=True)


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str] = {}


class ChannelReader(ClientExtension):
    """Hands each channel notification to ``handler`` (Claude Code would put it in the model's context)."""

    identifier = "dev.switchboard/channel-reader"

    def __init__(self, handler: Callable[[ChannelParams], Awaitable[None]]) -> None:
        self.handler = handler

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [
            NotificationBinding(method="notifications/claude/channel", params_type=ChannelParams, handler=self.handler)
        ]


def test_the_channel_announces_pending_and_new_work_without_claiming_it(mcp_base, make_agent, make_todo):
    agent = make_agent("alice", claim=["jobs.*"], create=["jobs.*", "other"])
    make_todo("jobs.a")
    make_todo("other")  # visible to the agent, but not a queue it asked to hear about
    params = StdioServerParameters(
        command=sys.executable,
        args=[str(ROOT / "examples" / "mcp_channel.py"), "--queues", "jobs.*", "--interval", "0.2"],
        env={**os.environ, "SWITCHBOARD_URL": mcp_base, "SWITCHBOARD_TOKEN": agent.token},
    )

    def create_two() -> None:
        try:
            queue.create(queue="jobs.b", title="new")
            queue.create(queue="jobs.b", title="newer")
        finally:
            connection.close()  # this worker thread's own connection

    async def scenario() -> tuple[Any, list[ChannelParams]]:
        send, receive = anyio.create_memory_object_stream[ChannelParams](10)
        got: list[ChannelParams] = []
        async with send, receive, Client(params, mode="legacy", extensions=[ChannelReader(send.send)]) as client:
            capabilities = client.server_capabilities
            with anyio.fail_after(20):
                got.append(await receive.receive())
                await anyio.to_thread.run_sync(create_two)
                got.append(await receive.receive())
                while sum(int(m.meta["count"]) for m in got) < 3:
                    got.append(await receive.receive())
        return capabilities, got

    capabilities, got = anyio.run(scenario)
    assert capabilities.experimental == {"claude/channel": {}}
    assert got[0].meta == {"queues": "jobs.a", "count": "1"} and "1 in jobs.a" in got[0].content
    assert {m.meta["queues"] for m in got[1:]} == {"jobs.b"}
    assert all("other" not in m.content for m in got)
    assert set(Todo.objects.values_list("state", flat=True)) == {TodoState.PENDING}
