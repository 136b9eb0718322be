"""Long-poll claims that cost nothing while they wait.

Transitions that make work claimable at once NOTIFY ``sql.NOTIFY_CHANNEL`` with the queue's name (and,
from batch statements, how many rows: ``"<queue> <n>"``) inside their own statement (todos/sql.py).
Each web process keeps one listening connection: psycopg's ``AsyncConnection``, a task in the server's
event loop (started by the ASGI lifespan, ``settings.ASGI_LIFESPAN``). Outside an ASGI server (the test
client, ``runserver``, a WSGI deployment) the same task runs in one daemon thread's own loop.

A waiting claim is an ``asyncio.Event`` in a FIFO of waiters: no thread, no database connection. One
notification wakes the longest-waiting matching waiter that is not already awake (``n`` of them for a
count), so one new todo costs one claim statement per process, not one per waiter. A woken waiter that
loses the race keeps its place and waits for the rest of its time. A wake that reached a waiter which
then left with other work is handed on, so N new todos reach up to N waiters.

Work can also become claimable with no write at all (a lease lapses, a retry comes due). The earliest
such moment in a waiter's queues is read from the database once per process and (agent, queues) at
most every DUE_CACHE_SECONDS, however many wait, and one timer per such key wakes one waiter of it
then, as a NOTIFY would. So a poll that finds nothing costs one claim statement, and nothing more while
it waits: there is no last claim at the deadline, since with the listener connected nothing is missed
(a reconnect makes every waiter claim again; while it is down, waiters poll).

The process's sync work runs in one thread (switchboard/asgi.py); this module's statements take turns
there, a few at a time, woken claims first: a wake is what a client is waiting for, and must not queue
behind a burst of re-polls that will most likely find nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fnmatch
import heapq
import itertools
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

import psycopg
from asgiref.sync import sync_to_async
from django.db import connections

from switchboard import dberrors
from todos import queue, selectors, sql
from todos.errors import QueueError
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
# How long a read of when work next becomes claimable without a write serves every waiter of the same
# agent and queues. A lease taken or a retry scheduled meanwhile elsewhere is seen by waiters that
# arrive after, at most this late (the reaper's NOTIFY still wakes them when it sweeps).
DUE_CACHE_SECONDS = 0.5
# How many of this module's statements may be queued in the sync thread at once: enough to keep it
# busy, few enough that a woken claim waits behind at most these (and the plain requests).
SYNC_SLOTS = 2
# Turns in the sync thread, lowest first.
WOKEN, POLL = 0, 1
# The listener checks its connection when it has heard nothing for this long.
KEEPALIVE_SECONDS = 30.0
RECONNECT_MAX_SECONDS = 5.0
# Agents' rows changed (todos/auth.py): every process forgets its cached tokens.
AGENTS_CHANNEL = "switchboard_agents"

T = TypeVar("T")
# Whose lapse and retry times a waiter waits for: its agent (assignees) and claim scopes, the queues it asked.
Key = tuple[int, str, tuple[str, ...], tuple[str, ...]]


def _globs_regex(globs: Sequence[str]) -> re.Pattern[str]:
    # Scopes and queue names use no [ ] (todos.models' validators), so fnmatch's * and ? are the
    # scopes' own glob meaning.
    return re.compile("|".join(fnmatch.translate(g) for g in globs))


def due_key(agent: Agent, queues: Sequence[str] | None) -> Key:
    return (agent.pk, agent.name, tuple(agent.claim_scopes), tuple(queues or ()))


class Waiter:
    """One waiting claim: its event (in its own loop), the queues it waits for (its claim scopes,
    narrowed by the queues it asked for), its key for lapse and retry timers, and the wakes it was
    given that it has not yet used (queue names from NOTIFY, its key from a timer)."""

    __slots__ = ("awake", "event", "key", "loop", "scopes", "wakes", "wanted")

    def __init__(self, scopes: Sequence[str], wanted: Sequence[str] | None, key: Key) -> None:
        self.loop = asyncio.get_running_loop()
        self.key = key
        self.event = asyncio.Event()
        self.scopes = _globs_regex(scopes) if scopes else None
        self.wanted = _globs_regex(wanted) if wanted else None
        # True from a wake until its claim has run: a second notification then goes to the next waiter.
        self.awake = True
        self.wakes: list[str | Key] = []

    def matches(self, queue_name: str) -> bool:
        if self.scopes is None or not self.scopes.match(queue_name):
            return False
        return self.wanted is None or self.wanted.match(queue_name) is not None


class _Turns:
    """Turns for this module's statements in the sync thread of an ASGI server's loop: at most
    SYNC_SLOTS queued there at once, the rest wait here by priority, then in order of arrival."""

    def __init__(self) -> None:
        self._running = 0
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def run(self, priority: int, call: Callable[[], Awaitable[T]]) -> T:
        await self._acquire(priority)
        try:
            return await call()
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self._running < SYNC_SLOTS and not self._queue:
            self._running += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (priority, next(self._order), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given the turn just as it was cancelled
                self._release()
            raise

    def _release(self) -> None:
        while self._queue:
            _, _, turn = heapq.heappop(self._queue)
            if not turn.done():  # a cancelled wait is done: skipped
                turn.set_result(None)  # the slot passes to it
                return
        self._running -= 1


class Listener:
    """This process's one LISTEN connection and its FIFO of waiting claims."""

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self.connected = threading.Event()
        # Insertion-ordered: the first key is the longest-waiting waiter.
        self._waiters: dict[Waiter, None] = {}
        # Waiters live in the server's loop, or (outside ASGI) in per-request loops of other threads.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self.shutting_down = False
        self._on_agents_changed: list[Callable[[], None]] = []
        # Per key: the armed timer's moment, and the last read of when work next becomes claimable
        # (read at, claimable at; time.monotonic()) or the read under way that other waiters share.
        self._timers: dict[Key, float] = {}
        self._due: dict[Key, tuple[float, float | None]] = {}
        self._reading: dict[Key, concurrent.futures.Future[tuple[bool, float | None]]] = {}
        self.turns = _Turns()
        # Waiters woken, claim statements run by waiters and reads of the next lapse or retry, so far
        # (tests and diagnostics read them).
        self.wakes = 0
        self.claims = 0
        self.due_reads = 0

    # --- waiters ---------------------------------------------------------------------------------
    def add(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters[waiter] = None

    def remove(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.pop(waiter, None)
            handed_on = waiter.wakes
            waiter.wakes = []
        for queue_name in handed_on:
            self._wake(queue_name)

    def _set(self, waiter: Waiter) -> None:
        if waiter.loop is self._loop:
            waiter.event.set()
        else:
            with contextlib.suppress(RuntimeError):  # its loop has closed: the waiter is gone
                waiter.loop.call_soon_threadsafe(waiter.event.set)

    def _wake(self, target: str | Key | None, count: int = 1) -> int:
        """Wake ``count`` waiters for ``target`` (a queue name, or a timer's key; every waiter for None),
        longest-waiting first, preferring those asleep; a wake for an awake waiter makes it claim once
        more after its claim."""
        with self._lock:
            if target is None:
                chosen = list(self._waiters)
            else:
                if isinstance(target, str):
                    matching = [w for w in self._waiters if w.matches(target)]
                else:
                    matching = [w for w in self._waiters if w.key == target]
                asleep = [w for w in matching if not w.awake]
                chosen = (asleep + [w for w in matching if w.awake])[:count]
            for waiter in chosen:
                waiter.awake = True
                if target is not None:
                    waiter.wakes.append(target)
            self.wakes += len(chosen)
        for waiter in chosen:
            self._set(waiter)
        return len(chosen)

    def wake_all(self) -> None:
        self._wake(None)

    def on_agents_changed(self, callback: Callable[[], None]) -> None:
        self._on_agents_changed.append(callback)

    # --- lapse and retry timers ------------------------------------------------------------------------
    async def claimable_at(self, key: Key, read: Callable[[], Awaitable[float | None]]) -> float | None:
        """When work in ``key``'s queues next becomes claimable with no write (time.monotonic(); in the
        past if it is already), or None: the last read if recent, else one read shared by every waiter
        that asks meanwhile, whichever loop it is in."""
        while True:
            now = time.monotonic()
            with self._lock:
                cached = self._due.get(key)
                # A moment that has passed says nothing now (the work was claimed, or is claimable): read again.
                if (
                    cached is not None
                    and now - cached[0] < DUE_CACHE_SECONDS
                    and (cached[1] is None or cached[1] > now)
                ):
                    return cached[1]
                reading = self._reading.get(key)
                if reading is None:
                    reading = self._reading[key] = concurrent.futures.Future()
                    task = asyncio.ensure_future(self._read_due(key, read, reading))
                else:
                    task = None
            # The read is its own task, so a caller that is cancelled (its client hung up) leaves it to
            # finish for the others.
            done, at = await asyncio.shield(asyncio.wrap_future(reading) if task is None else task)
            if done:
                return at

    async def _read_due(
        self,
        key: Key,
        read: Callable[[], Awaitable[float | None]],
        reading: concurrent.futures.Future[tuple[bool, float | None]],
    ) -> tuple[bool, float | None]:
        try:
            seconds = await read()
        except asyncio.CancelledError:  # its loop is closing (outside ASGI): the others read again
            self._forget_read(key, reading)
            reading.set_result((False, None))
            raise
        except BaseException as exc:
            self._forget_read(key, reading)
            reading.set_exception(exc)
            raise
        now = time.monotonic()
        at = None if seconds is None else now + seconds
        with self._lock:
            self.due_reads += 1
            if len(self._due) > 1000:  # one per (agent, queues) ever seen: drop what is out of date
                self._due = {k: v for k, v in self._due.items() if now - v[0] < DUE_CACHE_SECONDS}
            self._due[key] = (now, at)
        self._forget_read(key, reading)
        reading.set_result((True, at))
        return True, at

    def _forget_read(self, key: Key, reading: concurrent.futures.Future[tuple[bool, float | None]]) -> None:
        with self._lock:
            if self._reading.get(key) is reading:
                del self._reading[key]

    def forget_due(self, key: Key) -> None:
        """A lease was just taken in these queues: the next read must see it."""
        with self._lock:
            self._due.pop(key, None)

    def arm(self, key: Key, at: float) -> None:
        """Wake one waiter of ``key`` at ``at`` (time.monotonic()), unless a timer is armed sooner."""
        with self._lock:
            armed = self._timers.get(key)
            if armed is not None and armed <= at:
                return
            self._timers[key] = at
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed (a test's listener stopped)
                loop.call_soon_threadsafe(self._schedule, key, at)

    def _schedule(self, key: Key, at: float) -> None:
        asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()), self._fire, key, at)

    def _fire(self, key: Key, at: float) -> None:
        with self._lock:
            if self._timers.get(key) != at:  # superseded by a sooner timer, which has fired or will
                return
            del self._timers[key]
            # The moment has passed: the waiter woken reads what comes next afresh and arms for it.
            self._due.pop(key, None)
        self._wake(key)

    def _forget_timers(self) -> None:
        with self._lock:
            self._timers.clear()
            self._due.clear()

    # --- the listening task ------------------------------------------------------------------------
    def start(self) -> None:
        """Run the listener in the running loop (the ASGI server's), for this process's lifetime."""
        loop = asyncio.get_running_loop()
        if self._running_here(loop):
            return
        self._stop_thread()
        self._bind(loop)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.shutting_down = False
        self.connected.clear()
        self.turns = _Turns()
        self._pid = os.getpid()
        self._loop = loop
        self._task = loop.create_task(self._run(), name="switchboard-listener")

    def _running_here(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        return (
            self._pid == os.getpid()
            and self._loop is not None
            and not self._loop.is_closed()
            and (loop is None or self._loop is loop)
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

    async def shutdown(self) -> None:
        """Answer every waiter now (SIGTERM); the listener itself stops with the loop."""
        self.shutting_down = True
        self.wake_all()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listening connection (tests, before their database is dropped)."""
        self._stop_thread(timeout)

    def _stop_thread(self, timeout: float = 5.0) -> None:
        loop, task, thread = self._loop, self._task, self._thread
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        self._task = None
        self._loop = None
        self.connected.clear()
        # Timers were the stopped loop's; what was read came from a database that may be gone.
        self._forget_timers()

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
                    self._agents_changed()
                    self.wake_all()
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
                    self._agents_changed()
                    continue
                name, _, count = note.payload.partition(" ")
                self._wake(name, int(count) if count.isdigit() else 1)
            await conn.execute("SELECT 1")  # quiet for a while: a half-open connection raises here

    def _agents_changed(self) -> None:
        for callback in self._on_agents_changed:
            callback()


listener = Listener()


def _claim_sync(
    agent: Agent, queues: list[str] | None, limit: int, lease_seconds: float | None, worker: str | None
) -> list[Todo]:
    return queue.claim_next(agent=agent, queues=queues, limit=limit, lease_seconds=lease_seconds, worker=worker)


def _release_sync(todos: list[Todo], agent: Agent) -> None:
    for todo in todos:
        assert todo.lease_id is not None
        with contextlib.suppress(QueueError):
            queue.release(todo.id, agent=agent, lease_id=todo.lease_id)


# Every call runs in the process's one thread for sync work (switchboard/asgi.py keeps it one thread),
# so all of a process's queries share one persistent connection: none is opened per waiter or per request.
_claim = sync_to_async(_claim_sync, thread_sensitive=True)
_release_now = sync_to_async(_release_sync, thread_sensitive=True)
_seconds_until_claimable = sync_to_async(selectors.seconds_until_claimable, thread_sensitive=True)


async def _in_turn(priority: int, call: Callable[[], Awaitable[T]]) -> T:
    # Only an ASGI server's loop shares one sync thread among requests; elsewhere (the test client,
    # runserver, WSGI) each request has its own thread and nothing to queue behind.
    if listener._loop is asyncio.get_running_loop():
        return await listener.turns.run(priority, call)
    return await call()


async def _release(todos: list[Todo], agent: Agent) -> None:
    await _in_turn(WOKEN, lambda: _release_now(todos, agent))


async def _claim_delivering(agent: Agent, claim: Callable[[], Awaitable[list[Todo]]]) -> list[Todo]:
    """Run a claim to its end even if the request is cancelled meanwhile (its client hung up): what a
    cancelled claim took is released, so no todo sits out a lease nobody holds."""
    task = asyncio.ensure_future(claim())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        todos = await asyncio.shield(task)
        if todos:
            await asyncio.shield(_release(todos, agent))
        raise


async def claim_next_waiting(
    *,
    agent: Agent,
    queues: list[str] | None = None,
    limit: int = 1,
    lease_seconds: float | None = None,
    wait_seconds: float = 0,
    worker: str | None = None,
    client_gone: Callable[[], Awaitable[bool]] | None = None,
) -> list[Todo]:
    """queue.claim_next, waiting up to ``wait_seconds`` for work to become claimable in the queues.

    ``client_gone`` says the caller hung up: a woken waiter then stops instead of claiming a todo
    nobody would receive, and a claim that ran meanwhile is released. Cancelling the call (Django
    does when an ASGI client disconnects) does the same. On server shutdown it answers [] at once."""
    queues = list(queues) if queues else None
    key = due_key(agent, queues)
    priority = POLL

    async def claim() -> list[Todo]:
        listener.claims += 1
        todos = await _in_turn(priority, lambda: _claim(agent, queues, limit, lease_seconds, worker))
        if todos:
            listener.forget_due(key)
        return todos

    if wait_seconds <= 0:
        return await _claim_delivering(agent, claim)
    deadline = time.monotonic() + wait_seconds
    retry_after = MIN_RETRY_SECONDS
    if listener._loop is not asyncio.get_running_loop():
        listener._ensure_running()
    # Registered before the first claim, so a NOTIFY that lands between that claim and the wait is kept.
    waiter = Waiter(agent.claim_scopes, queues, key)
    listener.add(waiter)
    try:
        first = True
        while True:
            if listener.shutting_down:
                return []
            if not first and client_gone is not None and await client_gone():
                return []
            first = False
            waiter.event.clear()
            with listener._lock:
                used, waiter.wakes = waiter.wakes, []
            todos = await _claim_delivering(agent, claim)
            if client_gone is not None and todos and await client_gone():
                await _release(todos, agent)
                return []
            if todos:
                if key in used:
                    # A timer's wake found work and leaves with it: the next waiter claims in turn (more
                    # may have lapsed at once) and, finding nothing, arms the timer for what comes next.
                    listener._wake(key)
                return todos
            waiter.awake = False
            if any(isinstance(source, str) for source in used):
                # A NOTIFY woke it and its claim found nothing: the queue changed in a way that may move
                # the next claimable moment (a todo scheduled for soon), so the shared read is stale.
                listener.forget_due(key)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or listener.shutting_down:
                return []
            at = await listener.claimable_at(
                key, lambda: _in_turn(POLL, lambda: _seconds_until_claimable(agent, queues))
            )
            if at is not None:
                now = time.monotonic()
                if at > now:
                    listener.arm(key, at + LAPSE_MARGIN_SECONDS)
                    retry_after = MIN_RETRY_SECONDS
                else:  # claimable already, yet this claim found nothing (another claimer holds it): back off
                    listener.arm(key, now + retry_after)
                    retry_after = min(retry_after * 2, FALLBACK_POLL_SECONDS)
            connected = listener.connected.is_set()
            try:
                await asyncio.wait_for(
                    waiter.event.wait(), remaining if connected else min(remaining, FALLBACK_POLL_SECONDS)
                )
            except TimeoutError:
                # With the listener connected the timeout is the deadline, and any NOTIFY meanwhile
                # would have woken this waiter (a reconnect wakes every one): a last claim would find
                # nothing new. A waiter that polled or lost the listener claims once more.
                if connected and listener.connected.is_set():
                    return []
                waiter.awake = True
            priority = WOKEN
    finally:
        listener.remove(waiter)


# --- ASGI lifespan (settings.ASGI_LIFESPAN) -------------------------------------------------------
def _chain_signal(signum: int, loop: asyncio.AbstractEventLoop) -> None:
    """Answer the waiters first when the server is told to stop, then let the server's own handler
    run: it stops accepting and waits for the requests in flight, which now end at once."""
    previous = signal.getsignal(signum)

    def handler(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(listener.shutdown()))
        if callable(previous):
            previous(sig, frame)

    signal.signal(signum, handler)


async def startup() -> None:
    listener.start()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            _chain_signal(signum, loop)


async def shutdown() -> None:
    await listener.shutdown()
