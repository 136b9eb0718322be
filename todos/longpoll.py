"""Long-poll claims that cost nothing while they wait.

A waiting claim is an ``asyncio.Event`` in a FIFO of waiters: no thread, no database connection. What
the process's LISTEN connection (todos/listener.py) hears wakes them. One notification wakes the
longest-waiting matching waiter that is not already awake (``n`` of them for a count), so one new todo
costs one claim statement per process, not one per waiter. A woken waiter that loses the race keeps its
place and waits for the rest of its time. A wake that reached a waiter which then left with other work
is handed on, so N new todos reach up to N waiters. A wake whose claim found nothing is handed on to a
waiter of another agent, once per agent: the todo may be assigned to that one (a NOTIFY names only the
queue), and waiters of the same agent would find the same nothing.

Work can also become claimable with no write at all (a lease lapses, a retry comes due). The earliest
such moment in a waiter's queues is read from the database once per process and (agent, queues) at
most every DUE_CACHE_SECONDS, however many wait, and one timer per such key wakes one waiter of it
then, as a NOTIFY would. So a poll that finds nothing costs one claim statement, and nothing more while
it waits: there is no last claim at the deadline, since with the listener connected nothing is missed
(a reconnect makes every waiter claim again; while it is down, waiters poll).

Statements run on the process's bounded pool of threads (switchboard/executor.py), one hop each, never
in a thread that waits for the loop; the waiting itself is in the loop. A woken claim goes straight to the
pool; first polls and reads of when work comes are admitted a few at a time (half the pool), so a burst
of arriving waiters cannot queue ahead of every plain request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any

from django.conf import settings

from switchboard import executor
from todos import budgets, queue, selectors
from todos.errors import QueueError
from todos.globs import Glob, compile_glob
from todos.limits import LONG_POLL_IDLE_SPREAD
from todos.listener import AGENTS_CHANNEL, listener
from todos.models import Agent, Todo

__all__ = ["AGENTS_CHANNEL", "Waiter", "Waiters", "claim_next_waiting", "claim_now", "listener", "waiters"]

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

# Whose lapse and retry times a waiter waits for: its agent (assignees) and claim scopes, the queues it asked.
Key = tuple[int, str, tuple[str, ...], tuple[str, ...]]


class Notice:
    """A NOTIFY's wake for one queue, and the agents whose claims already found nothing for it."""

    __slots__ = ("queue", "tried")

    def __init__(self, queue_name: str, tried: frozenset[int] = frozenset()) -> None:
        self.queue = queue_name
        self.tried = tried


Wake = Notice | Key


def _globs(globs: Sequence[str]) -> tuple[Glob, ...]:
    # The scopes' own matcher (todos/globs.py): a caller's glob is data, never a regex.
    return tuple(compile_glob(g) for g in globs)


def due_key(agent: Agent, queues: Sequence[str] | None) -> Key:
    return (agent.pk, agent.name, tuple(agent.claim_scopes), tuple(queues or ()))


class Waiter:
    """One waiting claim: its event (in its own loop), the queues it waits for (its claim scopes,
    narrowed by the queues it asked for), its key for lapse and retry timers, and the wakes it was
    given that it has not yet used (NOTIFY notices, its key from a timer)."""

    __slots__ = ("awake", "event", "key", "loop", "scopes", "wakes", "wanted")

    def __init__(self, scopes: Sequence[str], wanted: Sequence[str] | None, key: Key) -> None:
        self.loop = asyncio.get_running_loop()
        self.key = key
        self.event = asyncio.Event()
        self.scopes = _globs(scopes) if scopes else None
        self.wanted = _globs(wanted) if wanted else None
        # True from a wake until its claim has run: a second notification then goes to the next waiter.
        self.awake = True
        self.wakes: list[Wake] = []

    @property
    def agent_id(self) -> int:
        return self.key[0]

    def matches(self, queue_name: str) -> bool:
        if self.scopes is None or not any(g.matches(queue_name) for g in self.scopes):
            return False
        return self.wanted is None or any(g.matches(queue_name) for g in self.wanted)


class Waiters:
    """This process's FIFO of waiting claims, and the timers and shared reads for lapses and retries."""

    def __init__(self) -> None:
        # Insertion-ordered: the first key is the longest-waiting waiter.
        self._waiters: dict[Waiter, None] = {}
        # Waiters live in the server's loop, or (outside ASGI) in per-request loops of other threads.
        self._lock = threading.Lock()
        self.shutting_down = False
        # Per key: the armed timer's moment, and the last read of when work next becomes claimable
        # (read at, claimable at; time.monotonic()) or the read under way that other waiters share.
        self._timers: dict[Key, float] = {}
        self._due: dict[Key, tuple[float, float | None]] = {}
        self._reading: dict[Key, concurrent.futures.Future[tuple[bool, float | None]]] = {}
        # Waiters woken, claim statements run by waiters and reads of the next lapse or retry, so far
        # (tests and diagnostics read them).
        self.wakes = 0
        self.claims = 0
        self.due_reads = 0

    def __len__(self) -> int:
        return len(self._waiters)

    def add(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters[waiter] = None

    def remove(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.pop(waiter, None)
            handed_on = waiter.wakes
            waiter.wakes = []
        for wake in handed_on:
            self._wake(wake)

    def take_wakes(self, waiter: Waiter) -> list[Wake]:
        with self._lock:
            used, waiter.wakes = waiter.wakes, []
        return used

    def _set(self, waiter: Waiter) -> None:
        if waiter.loop is listener.loop:
            waiter.event.set()
        else:
            with contextlib.suppress(RuntimeError):  # its loop has closed: the waiter is gone
                waiter.loop.call_soon_threadsafe(waiter.event.set)

    def notify(self, queue_name: str, count: int = 1) -> None:
        """A NOTIFY: ``count`` todos became claimable in ``queue_name``."""
        self._wake(Notice(queue_name), count)

    def _wake(self, target: Wake | None, count: int = 1) -> int:
        """Wake ``count`` waiters for ``target`` (a notice, or a timer's key; every waiter for None),
        longest-waiting first, preferring those asleep; a wake for an awake waiter makes it claim once
        more after its claim."""
        with self._lock:
            if target is None:
                chosen = list(self._waiters)
            else:
                if isinstance(target, Notice):
                    matching = [w for w in self._waiters if w.agent_id not in target.tried and w.matches(target.queue)]
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

    def found_nothing(self, waiter: Waiter, used: list[Wake]) -> None:
        """``waiter``'s claim after these wakes found nothing: a notice goes on to a waiter of an agent
        not yet tried (the todo may be assigned to it), and the shared read of when work comes is stale
        (the queue changed in a way that may move it: a todo scheduled for soon)."""
        notices = [wake for wake in used if isinstance(wake, Notice)]
        if notices:
            self.forget_due(waiter.key)
        for notice in notices:
            self._wake(Notice(notice.queue, notice.tried | {waiter.agent_id}))

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
            loop = listener.loop
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

    def forget_timers(self) -> None:
        with self._lock:
            self._timers.clear()
            self._due.clear()

    async def shutdown(self) -> None:
        """Answer every waiter now (SIGTERM)."""
        self.shutting_down = True
        self.wake_all()


waiters = Waiters()
listener.on_notify(waiters.notify)
listener.on_connected(waiters.wake_all)
# Timers were the stopped loop's; what was read came from a database that may be gone.
listener.on_stopped(waiters.forget_timers)


# Admission to the pool for long-polls' own statements (first polls and reads of when work comes): at
# most this many queued or running there at once, so a burst of thousands of waiters arriving or
# re-polling together leaves the other threads to plain requests, which go straight to the pool. Only
# coroutines on the loop wait here; every holder's statement is already in the pool, where nothing waits
# for the loop, so it always finishes and lets the next one in.
# FIFO across agents, on purpose (issue 28): AGENT_MAX_WAITS (todos/budgets.py) already bounds what one agent
# can queue here ahead of another to its open waits in this process (100 first polls: at a few ms a claim over
# WEB_THREADS / 2 slots, about a tenth of a second), so a round robin per agent would buy little for its cost
# on every first poll.
_gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _admitted() -> contextlib.AbstractAsyncContextManager[Any]:
    loop = asyncio.get_running_loop()
    if not executor.serving(loop):  # outside the server each request has its own thread: nothing to share
        return contextlib.nullcontext()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(max(1, settings.WEB_THREADS // 2))
    return gate


async def _read_due(agent: Agent, queues: list[str] | None) -> float | None:
    async with _admitted():
        return await executor.run(selectors.seconds_until_claimable, agent, queues)


def claim_now(
    *,
    agent: Agent,
    queues: list[str] | None = None,
    limit: int = 1,
    lease_seconds: float | None = None,
    worker: str | None = None,
) -> list[Todo]:
    """queue.claim_next, in this thread: a lease taken here moves when these queues next have work."""
    todos = queue.claim_next(agent=agent, queues=queues, limit=limit, lease_seconds=lease_seconds, worker=worker)
    if todos:
        waiters.forget_due(due_key(agent, queues))
    return todos


def _release_sync(todos: list[Todo], agent: Agent) -> None:
    for todo in todos:
        assert todo.lease_id is not None
        with contextlib.suppress(QueueError):
            queue.release(todo.id, agent=agent, lease_id=todo.lease_id)


async def _release(todos: list[Todo], agent: Agent) -> None:
    await executor.run(_release_sync, todos, agent)


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

    woken = False

    async def claim() -> list[Todo]:
        waiters.claims += 1
        # A claim a wake asked for goes straight to the pool: a client is waiting for it, and wakes are
        # as few as the work that came. First polls (and re-polls after a reconnect) take a gate.
        async with contextlib.nullcontext() if woken else _admitted():
            return await executor.run(
                claim_now, agent=agent, queues=queues, limit=limit, lease_seconds=lease_seconds, worker=worker
            )

    if wait_seconds <= 0:
        return await _claim_delivering(agent, claim)
    deadline = time.monotonic() + wait_seconds * (1 - LONG_POLL_IDLE_SPREAD * random.random())  # noqa: S311 (spread, not a secret)
    retry_after = MIN_RETRY_SECONDS
    if listener.loop is not asyncio.get_running_loop():
        listener._ensure_running()
    # Registered before the first claim, so a NOTIFY that lands between that claim and the wait is kept.
    waiter = Waiter(agent.claim_scopes, queues, key)
    # One of the agent's open waits (todos/budgets.py): refused (429) before anything is registered, given
    # back in the finally below, which every way out passes (work, timeout, the client gone, an error).
    budgets.wait_slots.take(agent)
    waiters.add(waiter)
    try:
        first = True
        while True:
            if waiters.shutting_down:
                return []
            if not first and client_gone is not None and await client_gone():
                return []
            first = False
            waiter.event.clear()
            used = waiters.take_wakes(waiter)
            woken = bool(used)
            todos = await _claim_delivering(agent, claim)
            if client_gone is not None and todos and await client_gone():
                await _release(todos, agent)
                return []
            if todos:
                if key in used:
                    # A timer's wake found work and leaves with it: the next waiter claims in turn (more
                    # may have lapsed at once) and, finding nothing, arms the timer for what comes next.
                    waiters._wake(key)
                return todos
            waiter.awake = False
            waiters.found_nothing(waiter, used)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or waiters.shutting_down:
                return []
            at = await waiters.claimable_at(key, lambda: _read_due(agent, queues))
            if at is not None:
                now = time.monotonic()
                if at > now:
                    waiters.arm(key, at + LAPSE_MARGIN_SECONDS)
                    retry_after = MIN_RETRY_SECONDS
                else:  # claimable already, yet this claim found nothing (another claimer holds it): back off
                    waiters.arm(key, now + retry_after)
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
    finally:
        waiters.remove(waiter)
        budgets.wait_slots.give_back(agent)


# --- ASGI lifespan (settings.ASGI_LIFESPAN) -------------------------------------------------------
def _chain_signal(signum: int, loop: asyncio.AbstractEventLoop) -> None:
    """Answer the waiters first when the server is told to stop, then let the server's own handler
    run: it stops accepting and waits for the requests in flight, which now end at once."""
    previous = signal.getsignal(signum)

    def handler(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(waiters.shutdown()))
        if callable(previous):
            previous(sig, frame)

    signal.signal(signum, handler)


async def startup() -> None:
    loop = asyncio.get_running_loop()
    executor.serve(loop)
    waiters.shutting_down = False
    listener.start()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            _chain_signal(signum, loop)


async def shutdown() -> None:
    await waiters.shutdown()
