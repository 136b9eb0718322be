"""A real redis-server for the stream tests (Debian's package; .ci/run installs it), and helpers to run
``manage.py consume_stream`` as a real process against the test database.

The server runs on a free private port in a temporary directory, with an append-only file fsynced on
every write, so a restart (SHUTDOWN, then the same command again) keeps the stream: the tests restart it
mid-run. It is stopped when the session ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from django.db import connection

BASE_DIR = Path(__file__).resolve().parents[2]
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def start(self) -> None:
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.directory),
            "save": "",
            "appendonly": "yes",
            "appendfsync": "always",
            "logfile": str(self.directory / "redis.log"),
        }
        self.proc = subprocess.Popen(
            [REDIS_SERVER, *(part for name, value in options.items() for part in (f"--{name}", value))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client().ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # redis-server flushes the append-only file and exits
            self.proc.wait(20)
        self.proc = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


def database_url() -> str:
    """The test database as a DATABASE_URL, for a child process (so it starts nothing embedded)."""
    db = connection.settings_dict
    host = db["HOST"] or db.get("OPTIONS", {}).get("host", "")
    auth = quote(db["USER"]) + (":" + quote(db["PASSWORD"]) if db["PASSWORD"] else "")
    if host.startswith("/"):  # a Unix socket directory (the embedded server)
        return f"postgres://{auth}@/{quote(db['NAME'])}?host={quote(host)}"
    return f"postgres://{auth}@{host}:{db['PORT'] or 5432}/{quote(db['NAME'])}"


class Consumer:
    """``manage.py consume_stream`` as a child process; its log goes to a file the test can read."""

    def __init__(self, log_path: Path, args: list[str], **env: str) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")  # closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "consume_stream", *args],
            cwd=BASE_DIR,
            env={
                **os.environ,
                "DATABASE_URL": database_url(),
                "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
                "PYTHONUNBUFFERED": "1",
                "LOG_LEVEL": "INFO",
                **env,
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        return self.log_path.read_text()


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
