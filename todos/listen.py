"""Long-poll claims: one LISTEN connection per server process wakes the requests waiting for work.

Transitions that make work claimable at once NOTIFY ``sql.NOTIFY_CHANNEL`` with the queue's name from
inside their own statement (todos/sql.py). A daemon thread holds this process's one listening
connection (psycopg, not Django's: it must outlive requests and sit outside their transactions) and
sets the event of every waiting request whose queues match the name. A woken request claims as usual.

Work can also become claimable with no write at all (a lease lapses, a retry comes due); a waiter
reads the earliest such moment in its queues from the database and sets its timeout to wake then.
While nothing arrives a waiting request makes no queries: it sleeps on its event.
"""

from __future__ import annotations

import atexit
import fnmatch
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections

from todos import queue, selectors, sql
from todos.models import Agent, Todo

logger = logging.getLogger(__name__)

# While the listening connection is down (start-up, a database restart), waiters fall back to
# polling this often, so a lost NOTIFY costs at most this much latency.
FALLBACK_POLL_SECONDS = 1.0
# After a timed wake that found nothing claimable (a lapsed row locked by another claimer, say), the
# next timed wake backs off from this to FALLBACK_POLL_SECONDS, so a waiter never spins.
MIN_RETRY_SECONDS = 0.05
# A lease lapses when lease_expires_at < now(): wake just after, not exactly at, that moment.
LAPSE_MARGIN_SECONDS = 0.005
# The listener checks its connection when it has heard nothing for this long.
KEEPALIVE_SECONDS = 30.0
RECONNECT_MAX_SECONDS = 5.0


def _globs_regex(globs: Sequence[str]) -> re.Pattern[str]:
    # Scopes and queue names use no [ ] (todos.models' validators), so fnmatch's * and ? are the
    # scopes' own glob meaning.
    return re.compile("|".join(fnmatch.translate(g) for g in globs))


class Waiter:
    """One waiting request: its event, and the queues it waits for (its claim scopes, narrowed by the
    queues it asked for)."""

    __slots__ = ("event", "scopes", "wanted")

    def __init__(self, scopes: Sequence[str], wanted: Sequence[str] | None) -> None:
        self.event = threading.Event()
        self.scopes = _globs_regex(scopes) if scopes else None
        self.wanted = _globs_regex(wanted) if wanted else None

    def matches(self, queue_name: str) -> bool:
        if self.scopes is None or not self.scopes.match(queue_name):
            return False
        return self.wanted is None or self.wanted.match(queue_name) is not None


class Listener:
    """This process's one LISTEN connection and the set of waiting requests."""

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self.connected = threading.Event()
        self._waiters: set[Waiter] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._stopping = threading.Event()
        # Waiters woken so far (tests and diagnostics read it).
        self.wakes = 0

    # --- waiters (request threads) -------------------------------------------------------------
    @contextmanager
    def waiting(self, waiter: Waiter) -> Iterator[Waiter]:
        self._ensure_running()
        with self._lock:
            self._waiters.add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def _wake(self, queue_name: str | None) -> int:
        with self._lock:
            woken = [w for w in self._waiters if queue_name is None or w.matches(queue_name)]
            self.wakes += len(woken)
        for waiter in woken:
            waiter.event.set()
        return len(woken)

    # --- the listening thread --------------------------------------------------------------------
    def _ensure_running(self) -> None:
        # A forked child (a gunicorn worker) has no thread of its own yet: start one per process.
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
                return
            self._stopping.clear()
            self.connected.clear()
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="switchboard-listener", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listening connection (tests, before their database is dropped)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    def _connection_params(self) -> dict[str, Any]:
        params = connections[self.alias].get_connection_params()
        for django_only in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(django_only, None)
        params["application_name"] = "switchboard-listener"
        return params

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**self._connection_params(), autocommit=True) as conn:
                    conn.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
                    self.connected.set()
                    backoff = 0.1
                    # Anything notified while we were not listening is lost: let every waiter look again.
                    self._wake(None)
                    self._listen(conn)
            except Exception as exc:  # any failure of the connection: reconnect after a pause
                if not self._stopping.is_set():
                    logger.warning("listener connection lost (%s); reconnecting", exc.__class__.__name__)
            finally:
                self.connected.clear()
            if self._stopping.wait(backoff):
                break
            backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            # notifies() returns after the timeout, so a stop is noticed within a second.
            for note in conn.notifies(timeout=1.0):
                self._wake(note.payload)
                quiet_since = time.monotonic()
            if time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                conn.execute("SELECT 1")  # a half-open connection raises here, and we reconnect
                quiet_since = time.monotonic()


listener = Listener()
# At interpreter exit the database connection may go first: don't log that as a loss.
atexit.register(listener._stopping.set)


def socket_closed_by_peer(sock: socket.socket) -> bool:
    """True if the peer has closed the connection (an orderly EOF is readable). Pending bytes (a
    pipelined request) or nothing to read yet mean it is still there."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def claim_next_waiting(
    *,
    agent: Agent,
    queues: Sequence[str] | None = None,
    limit: int = 1,
    lease_seconds: float | None = None,
    worker: str | None = None,
    wait_seconds: float = 0,
    client_gone: Callable[[], bool] | None = None,
) -> list[Todo]:
    """queue.claim_next, waiting up to ``wait_seconds`` for work to become claimable in the queues.

    ``client_gone`` (when the server can tell) says the caller hung up: a woken waiter then stops
    instead of claiming a todo nobody would receive (it would sit out its lease, an attempt spent)."""
    queues = list(queues) if queues else None

    def claim() -> list[Todo]:
        return queue.claim_next(agent=agent, queues=queues, limit=limit, lease_seconds=lease_seconds, worker=worker)

    if wait_seconds <= 0:
        return claim()
    deadline = time.monotonic() + wait_seconds
    retry_after = MIN_RETRY_SECONDS
    # Registered before the first claim, so a NOTIFY that lands between that claim and the wait is kept.
    with listener.waiting(Waiter(agent.claim_scopes, queues)) as waiter:
        first = True
        while True:
            waiter.event.clear()
            if not first and client_gone is not None and client_gone():
                return []
            first = False
            todos = claim()
            if todos:
                return todos
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            timeout = remaining
            due = selectors.seconds_until_claimable(agent, queues)
            if due is not None:
                timeout = min(timeout, due + LAPSE_MARGIN_SECONDS if due > 0 else retry_after)
            if not listener.connected.is_set():
                timeout = min(timeout, FALLBACK_POLL_SECONDS)
            if waiter.event.wait(timeout):
                retry_after = MIN_RETRY_SECONDS
            else:
                retry_after = min(retry_after * 2, FALLBACK_POLL_SECONDS)
