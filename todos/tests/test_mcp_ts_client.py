"""The MCP tools through a client no one here wrote: the official TypeScript SDK 1.x (pinned in
todos/tests/mcp_ts/package.json, installed by .ci/run with `npm ci`). That client validates every
structuredContent against the tool's output schema, errors included, so an error body put there came
back as -32602 "Structured content does not match the tool's output schema" and hid its code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

import switchboard
from todos.models import Todo, TodoState
from todos.tests.mcp_live import mcp_base

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT_DIR = Path(__file__).resolve().parent / "mcp_ts"
NODE = shutil.which("node")


def _missing(reason: str) -> NoReturn:
    # CI installs both (.ci/run), so there a missing client is a failure, never a quiet skip.
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _run_client(script: str, **env: str) -> dict[str, object]:
    if NODE is None:
        _missing("node is not installed (Node.js 18 or later: apt-get install nodejs)")
    if not (CLIENT_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        _missing("the TypeScript SDK is not installed: npm ci --prefix todos/tests/mcp_ts")
    done = subprocess.run(
        [NODE, script], cwd=CLIENT_DIR, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_typescript_sdk_client_reads_a_stale_lease_as_a_conflict_with_the_current_state(mcp_base, agent, make_todo):
    todo = make_todo("jobs")
    seen = _run_client(
        "stale_lease.mjs", SWITCHBOARD_MCP_URL=mcp_base + "/mcp", SWITCHBOARD_TOKEN=agent.token, TODO_ID=todo.id
    )

    assert seen["server"] == {"name": "switchboard", "version": switchboard.__version__, "title": "Switchboard"}
    assert "complete" in seen["tools"] and seen["reclaimed"] == "claimed"
    stale = seen["stale"]
    assert stale["isError"] is True and stale["structuredContent"] is None, stale  # not thrown: read
    assert stale["body"]["error"]["code"] == "conflict" and stale["body"]["error"]["state"] == "claimed"
    assert seen["unknown"] == {"code": -32602, "message": "MCP error -32602: Unknown tool: delete_everything"}
    assert Todo.objects.get().state == TodoState.CLAIMED  # the stale complete changed nothing
