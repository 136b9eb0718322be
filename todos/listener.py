"""This process's one LISTEN connection.

Transitions that make work claimable at once NOTIFY ``sql.NOTIFY_CHANNEL`` with the queue's name (and,
from batch statements, how many rows: ``"<queue> <n>"``) inside their own statement (todos/sql/);
todos/auth.py's agent changes NOTIFY ``AGENTS_CHANNEL``. Each web process keeps one listening
connection: psycopg's ``AsyncConnection``, a task in the server's event loop (started by the ASGI
lifespan through todos/longpoll.py). Outside an ASGI server (the test client, ``runserver``, a WSGI
deployment) the same task runs in one daemon thread's own loop.

It reaches PostgreSQL directly (the ``listener`` database alias, from LISTEN_DATABASE_URL, when the
default one goes through PgBouncer in transaction mode, which would drop a LISTEN). What it hears is
handed to the callbacks registered here: the waiters (todos/longpoll.py) and the token cache
(todos/auth.py). It never runs a request's statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections

from switchboard import dberrors
from todos import sql

logger = logging.getLogger(__name__)

# The listener checks its connection when it has heard nothing for this long.
KEEPALIVE_SECONDS = 30.0
RECONNECT_MAX_SECONDS = 5.0
# Agents' rows changed (todos/auth.py): every process forgets its cached tokens.
AGENTS_CHANNEL = "switchboard_agents"


class Listener:
    """The LISTEN connection's task, and who is told what it hears:

    - ``on_notify(queue_name, count)``: work became claimable;
    - ``on_connected()``: (re)connected, so anything notified while it was down was lost;
    - ``on_agents_changed()``: cached tokens are stale;
    - ``on_stopped()``: the loop it ran in is going (timers armed there are gone).
    """

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self.connected = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._notify: list[Callable[[str, int], None]] = []
        self._connected: list[Callable[[], None]] = []
        self._agents: list[Callable[[], None]] = []
        self._stopped: list[Callable[[], None]] = []

    def on_notify(self, callback: Callable[[str, int], None]) -> None:
        self._notify.append(callback)

    def on_connected(self, callback: Callable[[], None]) -> None:
        self._connected.append(callback)

    def on_agents_changed(self, callback: Callable[[], None]) -> None:
        self._agents.append(callback)

    def on_stopped(self, callback: Callable[[], None]) -> None:
        self._stopped.append(callback)

    # --- where it runs ---------------------------------------------------------------------------
    def start(self) -> None:
        """Run the listener in the running loop (the ASGI server's), for this process's lifetime."""
        loop = asyncio.get_running_loop()
        if self._running_here(loop):
            return
        self._stop_thread()
        self._bind(loop)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.connected.clear()
        self._pid = os.getpid()
        self.loop = loop
        self._task = loop.create_task(self._run(), name="switchboard-listener")

    def _running_here(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        return (
            self._pid == os.getpid()
            and self.loop is not None
            and not self.loop.is_closed()
            and (loop is None or self.loop is loop)
            and self._task is not None
            and not self._task.done()
        )

    def _ensure_running(self) -> None:
        """Outside an ASGI server, run the listener in a daemon thread's own loop."""
        if self._running_here():
            return
        with self._lock:
            if self._running_here():
                return
            started = threading.Event()

            def run() -> None:
                loop = asyncio.new_event_loop()
                self._bind(loop)
                started.set()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(self._task)  # type: ignore[arg-type]
                loop.close()

            self._thread = threading.Thread(target=run, name="switchboard-listener", daemon=True)
            self._thread.start()
            started.wait(5)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listening connection (tests, before their database is dropped)."""
        self._stop_thread(timeout)

    def _stop_thread(self, timeout: float = 5.0) -> None:
        loop, task, thread = self.loop, self._task, self._thread
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        self._task = None
        self.loop = None
        self.connected.clear()
        for callback in self._stopped:
            callback()

    # --- the connection --------------------------------------------------------------------------
    def _connection_params(self) -> dict[str, Any]:
        alias = "listener" if "listener" in connections.settings else self.alias
        params = connections[alias].get_connection_params()
        for django_only in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(django_only, None)
        params["application_name"] = "switchboard-listener"
        return params

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(**self._connection_params(), autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
                    await conn.execute(f"LISTEN {AGENTS_CHANNEL}")
                    self.connected.set()
                    backoff = 0.1
                    # Anything notified while we were not listening is lost: every waiter looks again,
                    # and cached tokens are forgotten.
                    self._tell(self._agents)
                    self._tell(self._connected)
                    await self._listen(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the connection: say why, reconnect after a pause
                dberrors.log_failure(logger, "listener connection", exc)
            finally:
                self.connected.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            async for note in conn.notifies(timeout=KEEPALIVE_SECONDS):
                if note.channel == AGENTS_CHANNEL:
                    self._tell(self._agents)
                    continue
                name, _, count = note.payload.partition(" ")
                for callback in self._notify:
                    callback(name, int(count) if count.isdigit() else 1)
            await conn.execute("SELECT 1")  # quiet for a while: a half-open connection raises here

    @staticmethod
    def _tell(callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            callback()


listener = Listener()
