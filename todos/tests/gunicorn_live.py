"""The Procfile's web server for tests: gunicorn -c gunicorn.conf.py (uvicorn workers) on a free port,
against the test database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, workers: int, tmp: Path, env: dict[str, str] | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        s = connection.settings_dict
        self.log = open(tmp / "gunicorn.log", "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
                "DATABASE_URL": f"postgres://{s['USER']}@/{s['NAME']}?host={s['HOST']}",
                "GUNICORN_BIND": f"127.0.0.1:{self.port}",
                "GUNICORN_WORKERS": str(workers),
                "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"),
                "LOG_LEVEL": "WARNING",
                **(env or {}),
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=5):  # noqa: S310 (local)
                    break
            except OSError:
                assert self.proc.poll() is None, self.output()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)

    def output(self, tail: int = 4000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-tail:]

    def claim_statements(self) -> float:
        """claim_next calls by the server's processes, from its /metrics."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as response:  # noqa: S310 (local)
            body = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith("switchboard_todo_transitions_total{") and 'verb="claim_next"' in line
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(workers: int = 2, env: dict[str, str] | None = None) -> Server:
        servers.append(Server(workers, tmp_path, env))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def worker_pids(master: int) -> set[int]:
    """The live children of a gunicorn master (its workers), from /proc."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == master and fields[0] != "Z":
            pids.add(int(stat.parent.name))
    return pids
