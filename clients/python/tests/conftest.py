"""The client's tests run against the shipped server (todos/tests/gunicorn_live.py: gunicorn with uvicorn
workers on a free port, over the suite's real PostgreSQL). One server per module (it takes seconds to
start); each test's agents and todos are committed (transactional tests), so the server sees them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from todos.tests.gunicorn_live import Server

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "clients" / "python" / "src"


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = Server(2, tmp_path_factory.mktemp("server"))
    yield started
    started.stop()


@pytest.fixture
def env(server: Server, agent: Any) -> dict[str, str]:
    """The environment of a process speaking to the server as ``agent`` (alice, every scope)."""
    return {
        **os.environ,
        "SWITCHBOARD_URL": server.base,
        "SWITCHBOARD_TOKEN": agent.token,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), str(ROOT), os.environ.get("PYTHONPATH")])),
    }
