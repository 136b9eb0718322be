"""A live uvicorn server on switchboard.asgi, against the test database, for the MCP tests; and the
official mcp 2.x client pointed at it with an agent's token."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@/{s['NAME']}?host={s['HOST']}"


def _wait_until_up(server: subprocess.Popen[bytes], base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=5):  # noqa: S310 (a local test server)
                return
        except OSError:
            if server.poll() is not None:
                raise AssertionError("the server exited (MCP_TEST_SERVER_LOG=1 shows its log)") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextmanager
def live_server(command: list[str]) -> Iterator[str]:
    """Runs ``command`` (given the port as {port}) against the test database; yields its base URL."""
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
        "DATABASE_URL": database_url(),
        # Every process looks tokens up afresh: a test that deactivates an agent sees it at once.
        "API_TOKEN_CACHE_SECONDS": "0",
    }
    server = subprocess.Popen(
        [part.format(port=port) for part in command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("MCP_TEST_SERVER_LOG") else subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(server, base)
        yield base
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


UVICORN = [sys.executable, "-m", "uvicorn", "switchboard.asgi:application", "--port", "{port}", "--log-level", "error"]
GUNICORN_UVICORN = [
    sys.executable,
    "-m",
    "gunicorn",
    "switchboard.asgi:application",
    "--worker-class",
    "uvicorn_worker.UvicornWorker",
    "--workers",
    "2",
    "--bind",
    "127.0.0.1:{port}",
    "--log-level",
    "error",
]


@pytest.fixture(scope="module")
def mcp_base(django_db_setup: None) -> Iterator[str]:
    """http://127.0.0.1:PORT of a uvicorn process serving the whole ASGI app (Django and /mcp)."""
    with live_server(UVICORN) as base:
        yield base


@asynccontextmanager
async def mcp_client(base: str, token: str | None, mode: Any = "auto") -> AsyncIterator[Client]:
    """The official client over streamable HTTP; ``mode`` is "auto", "legacy" (the 2025 handshake) or a
    modern revision such as "2026-07-28"."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as http:
        async with Client(streamable_http_client(base + "/mcp", http_client=http), mode=mode) as client:
            yield client
