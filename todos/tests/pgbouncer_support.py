"""A real PgBouncer in transaction mode in front of the test database (Debian's ``pgbouncer`` package;
.ci/run installs it), on a free private port, as the stream tests start redis-server.

Its pool is small (a few server connections for every client), so that statements of different
requests share server connections: whatever one left behind (a prepared statement, a cursor, a SET)
the next would meet. PgBouncer refuses to run as root: it then runs as the user that owns the embedded
PostgreSQL's socket directory, which can reach that socket.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
POOL_SIZE = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    def __init__(self, directory: Path, pool_size: int = POOL_SIZE) -> None:
        self.directory = directory
        self.pool_size = pool_size
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        s = connection.settings_dict
        self.user = s["USER"]
        # The test settings name the embedded server's socket directory as HOST; a DATABASE_URL of the
        # embedded server (bench/harness.py) puts it in ?host=, which django-environ leaves in OPTIONS.
        self.socket_dir = s["HOST"] or s.get("OPTIONS", {}).get("host", "")
        self.upstream_port = s["PORT"] or s.get("OPTIONS", {}).get("port") or "5432"

    def url(self, database: str) -> str:
        """A DATABASE_URL for ``database`` through PgBouncer."""
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        ini = self.directory / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.socket_dir} port={self.upstream_port} user={self.user}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.directory}\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            # The admin console (SHOW POOLS: its client and server connections, bench/ops/scale_out.py).
            f"admin_users = {self.user}\n"
            "max_client_conn = 2000\n"
            # psycopg sends none of these today; a driver upgrade that did must not break the tests.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.directory / 'pgbouncer.log'}\n"
            f"pidfile = {self.directory / 'pgbouncer.pid'}\n"
        )
        command = [PGBOUNCER, str(ini)]
        if os.geteuid() == 0:
            owner = pwd.getpwuid(os.stat(self.socket_dir).st_uid)
            for path in (self.directory, ini):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command = [PGBOUNCER, "-u", owner.pw_name, str(ini)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.directory / "pgbouncer.log"
                    raise RuntimeError(f"pgbouncer did not start: {log.read_text() if log.exists() else ''}") from None
                time.sleep(0.1)

    def show(self, what: str) -> list[dict[str, object]]:
        """``SHOW <what>`` on the admin console (e.g. POOLS), as rows of column -> value. The console
        speaks only the simple query protocol: a client-side cursor."""
        if what.upper() not in ("POOLS", "STATS", "CLIENTS", "SERVERS"):
            raise ValueError(what)
        url = self.url("pgbouncer")
        with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor, connect_timeout=5) as conn:
            cursor = conn.execute(f"SHOW {what.upper()}")
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # PgBouncer's "safe shutdown"
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    if not os.path.exists(PGBOUNCER):
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    # Not under pytest's own temporary folder, which only root may enter.
    directory = Path(tempfile.mkdtemp(prefix="switchboard-pgbouncer-"))
    bouncer = PgBouncer(directory)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(directory, ignore_errors=True)
