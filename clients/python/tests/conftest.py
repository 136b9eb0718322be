"""The client's tests run against the shipped server: gunicorn with uvicorn workers (gunicorn.conf.py)
on a free port, over the suite's real PostgreSQL. One server per module (it takes seconds to start);
each test's agents and todos are committed (transactional tests), so the server sees them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "clients" / "python" / "src"


class Server:
    def __init__(self, tmp: Path, workers: int = 2) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        db = connection.settings_dict
        self.log = open(tmp / "gunicorn.log", "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
                "DATABASE_URL": f"postgres://{db['USER']}@/{db['NAME']}?host={db['HOST']}",
                "GUNICORN_BIND": f"127.0.0.1:{self.port}",
                "GUNICORN_WORKERS": str(workers),
                "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"),
                "LOG_LEVEL": "WARNING",
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=5):  # noqa: S310 (local)
                    break
            except OSError:
                assert self.proc.poll() is None, self.output()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = Server(tmp_path_factory.mktemp("server"))
    yield started
    started.stop()


@pytest.fixture
def env(server: Server, agent: Any) -> dict[str, str]:
    """The environment of a process speaking to the server as ``agent`` (alice, every scope)."""
    return {
        **os.environ,
        "SWITCHBOARD_URL": server.url,
        "SWITCHBOARD_TOKEN": agent.token,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), str(ROOT), os.environ.get("PYTHONPATH")])),
    }
