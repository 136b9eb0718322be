"""The worker runtime: claim todos ahead of the free slots (a bounded prefetch, two claims in flight),
run a handler per ``kind`` (sync handlers in threads, async ones on the loop), heartbeat every third of
the lease, and send completions at once, batched with whatever finished while one was on its way.
At-least-once, as the queue is: a crash before a completion is sent means the todo runs again when its
lease lapses.

    worker = Worker(Client(), queues=["email"], concurrency=8, lease_seconds=60)

    @worker.handler("send")
    def send(todo):
        ...                       # return value -> the todo's result
                                  # raise Exception -> fail (retry with backoff, or Fail(retry_in=...))
                                  # raise Release -> back to pending, the attempt given back
                                  # raise Wait(todos=/event=/token=, timeout_seconds=) -> waiting
    worker.run()                  # SIGTERM/SIGINT: stop claiming, finish within the grace, release the rest
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import logging
import os
import queue as threadqueue
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from switchboard_client.client import AsyncClient, Client
from switchboard_client.errors import Conflict, Forbidden, Invalid, NotFound, SwitchboardError, Unauthorized
from switchboard_client.models import JSON, CreatedTodo, Todo, WaitingTodo

log = logging.getLogger("switchboard_client.worker")

H = TypeVar("H", bound=Callable[..., Any])
ANY_KIND = "*"
MAX_BATCH = 100  # the server's batch-complete limit
MAX_CLAIM = 100  # the server's claim limit
ANSWER_IN_FLIGHT_SECONDS = 1.0  # on a stop, how long a claim's answer may take to arrive before a hang-up
IDLE_RECLAIM_SECONDS = 1.0  # an idle worker that does not long-poll (poll_seconds 0) looks again this often
MIN_PREFETCH = 10  # the default prefetch: concurrency, but at least this (one claim's cost over several todos)


class Release(Exception):
    """Raised by a handler: hand the todo back (pending at once, its attempt given back)."""


class Fail(Exception):
    """Raised by a handler to fail the todo with a chosen retry delay. Any exception fails it; this one
    (or any exception with a ``retry_in`` attribute) also says when to retry, in seconds."""

    def __init__(self, message: str, *, retry_in: float | None = None) -> None:
        super().__init__(message)
        self.retry_in = retry_in


class Wait(Exception):
    """Raised by a handler: give the lease back and wait (``Client.wait``'s arguments) for other todos, an
    event, a token or ``people``' decision (issue 29: the resolution is {"by": "person", "decision",
    "edited", "text", "decided_by", "at"}); the todo is claimed again once the wait ends, with its
    ``resolution``. ``resolvers``:
    the agents that may also resolve it (never this worker's own).
    ``on_waiting`` gets the ``WaitingTodo``: for a token wait, its ``waitpoint`` (shown only then)."""

    def __init__(
        self,
        *,
        timeout_seconds: float,
        todos: Iterable[Todo | str] | None = None,
        event: Mapping[str, JSON] | None = None,
        token: bool = False,
        people: Mapping[str, JSON] | None = None,
        on_timeout: str | None = None,
        on_waiting: Callable[[WaitingTodo], object] | None = None,
        resolvers: Iterable[str] | None = None,
    ) -> None:
        super().__init__("wait")
        self.arguments: dict[str, Any] = {
            "timeout_seconds": timeout_seconds,
            "todos": list(todos) if todos is not None else None,
            "event": event,
            "token": token,
            "people": people,
            "on_timeout": on_timeout,
            "resolvers": list(resolvers) if resolvers is not None else None,
        }
        self.on_waiting = on_waiting


class LeaseLost(Exception):
    """Raised by ``Context.check()`` once the lease is gone: the outcome will not be sent."""


@dataclass
class Context:
    """What a handler that takes two arguments gets beside the todo. ``lease_lost`` turns true when a
    heartbeat is refused (another worker holds the todo, or it was cancelled: ``lost_state`` says
    which) or the worker gave the todo back at shutdown; from then on the handler's outcome is dropped.

    ``progress()``, ``checkpoint()`` and ``usage()`` ride on the next heartbeat; with ``now=True`` (the
    default for a checkpoint) that heartbeat is sent at once. Usage left unsent when the handler returns goes
    with a last heartbeat before the completion. ``budget_exhausted`` turns true when a heartbeat says the
    todo's tree has spent its budget: the handler should stop (its lease is still held)."""

    todo: Todo
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)
    lost_state: str | None = None
    #: Set by the worker: wakes the heartbeat task (thread-safe) to send what is pending now.
    _wake: Callable[[], object] = field(default=lambda: None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _progress: dict[str, JSON] | None = field(default=None, repr=False)
    _checkpoint: JSON = field(default=None, repr=False)
    _has_checkpoint: bool = field(default=False, repr=False)
    _usage: dict[str, float] = field(default_factory=dict, repr=False)
    budget_exhausted: bool = False
    #: Set by the worker: its own client (for create) and the async one it claims with (for acreate).
    _client: Client | None = field(default=None, repr=False)
    _api: AsyncClient | None = field(default=None, repr=False)

    @property
    def lease_lost(self) -> bool:
        return self._lost.is_set()

    @property
    def saved(self) -> JSON:
        """The checkpoint an earlier attempt saved (None if none): resume from it."""
        return self.todo.checkpoint

    def progress(self, percent: float | None = None, message: str | None = None, *, now: bool = False) -> None:
        """Report how far the work is (percent 0-100, a message of at most 500 characters)."""
        progress: dict[str, JSON] = {}
        if percent is not None:
            progress["percent"] = percent
        if message is not None:
            progress["message"] = message
        with self._lock:
            self._progress = progress
        if now:
            self._wake()

    def checkpoint(self, state: JSON, *, now: bool = True) -> None:
        """Save ``state`` (a JSON object, at most 64 KB): the next claimer gets it as
        ``todo.checkpoint`` if this attempt ends without completing."""
        with self._lock:
            self._checkpoint, self._has_checkpoint = state, True
        if now:
            self._wake()

    def usage(self, *, now: bool = False, **counters: float) -> None:
        """Report what the work used ({tokens_in=..., cost_usd=...}): added up until the next heartbeat
        sends it, which adds it to the todo's usage and its tree's (budgets)."""
        with self._lock:
            for name, value in counters.items():
                self._usage[name] = self._usage.get(name, 0) + value
        if now:
            self._wake()

    def create(self, queue: str, **fields: Any) -> CreatedTodo:
        """Create a child of this todo (agent trees): ``create``'s arguments, under this lease's receipt.
        From a sync handler; an async one awaits ``acreate``."""
        if self._client is None:
            raise RuntimeError("ctx.create needs the worker's Client; an async handler awaits ctx.acreate")
        return self._client.create(queue, parent=self.todo, **fields)

    async def acreate(self, queue: str, **fields: Any) -> CreatedTodo:
        """``create`` for an async handler."""
        if self._api is None:
            raise RuntimeError("ctx.acreate runs inside a worker's handler")
        return await self._api.create(queue, parent=self.todo, **fields)

    def _take(self) -> dict[str, JSON]:
        """What the next heartbeat carries; it is forgotten once taken (sent, or given back on error)."""
        with self._lock:
            report: dict[str, JSON] = {}
            if self._progress is not None:
                report["progress"] = self._progress
            if self._has_checkpoint:
                report["checkpoint"] = self._checkpoint
            if self._usage:
                report["usage"] = dict(self._usage)
            self._progress, self._checkpoint, self._has_checkpoint = None, None, False
            self._usage = {}
            return report

    def _give_back(self, report: dict[str, JSON]) -> None:
        """A heartbeat that failed: keep its report for the next, unless newer ones came meanwhile."""
        with self._lock:
            if self._progress is None and "progress" in report:
                self._progress = report["progress"]
            if not self._has_checkpoint and "checkpoint" in report:
                self._checkpoint, self._has_checkpoint = report["checkpoint"], True
            for name, value in dict(report.get("usage") or {}).items():
                self._usage[name] = self._usage.get(name, 0) + value

    def check(self) -> None:
        """Raise LeaseLost if the lease is gone: call it between steps of a long handler."""
        if self._lost.is_set():
            raise LeaseLost(f"{self.todo.id}: the lease is gone ({self.lost_state})")

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block (in a sync handler) until the lease is lost or ``timeout`` passes; True if lost."""
        return self._lost.wait(timeout)

    def _lose(self, state: str | None) -> None:
        self.lost_state = state
        self._lost.set()


@dataclass
class Stats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    released: int = 0
    #: Handed back to wait (a handler's ``Wait``).
    waited: int = 0
    #: Outcomes dropped because the lease was gone (heartbeat or completion answered 409).
    lost: int = 0


@dataclass
class _Handler:
    function: Callable[..., Any]
    is_async: bool
    wants_context: bool


def _positional(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


class _Threads:
    """Daemon threads for sync handlers: a handler still running when the process exits (after the
    grace, its todo released) does not hold the exit up, as a ThreadPoolExecutor's would."""

    def __init__(self, size: int) -> None:
        self._jobs: threadqueue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = threadqueue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"handler-{i}") for i in range(size)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to the awaiting task, as an executor would
                    future.set_exception(exc)

    def run(self, function: Callable[[], Any]) -> Awaitable[Any]:
        future: Future[Any] = Future()
        self._jobs.put((function, future))
        return asyncio.wrap_future(future)

    def stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


class Worker:
    """Runs handlers for the todos of ``queues`` (names or globs; None: all the token's claim scopes).

    ``concurrency`` handlers at once; ``lease_seconds`` per claim, heartbeated every third of it;
    ``poll_seconds`` of long-poll when idle; on SIGTERM, ``grace_seconds`` for running handlers before
    their todos are released.

    Throughput: up to ``prefetch`` todos (default: ``concurrency``, at least 10, at most 100) are claimed
    ahead of free slots, with up to ``claims_in_flight`` claims on their way at once; a prefetched todo
    not started within a third of its lease is released (so it never lapses), and claiming ahead waits
    until a handler frees. Completions are sent at once when none is on its way, else together with
    whatever finished meanwhile (``flush_batches`` batches on their way at most); ``flush_seconds``
    (default 0) lets a completion wait that long for company. A claim long-polls (``poll_seconds``)
    only once the last one came back empty."""

    def __init__(
        self,
        client: Client | AsyncClient | None = None,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 1,
        lease_seconds: float = 60.0,
        poll_seconds: float = 20.0,
        grace_seconds: float = 30.0,
        flush_seconds: float = 0.0,
        name: str | None = None,
        drain: bool = False,
        prefetch: int | None = None,
        claims_in_flight: int = 2,
        flush_batches: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and not 0 <= prefetch <= MAX_CLAIM:
            raise ValueError(f"prefetch must be between 0 and {MAX_CLAIM}")
        if claims_in_flight < 1 or flush_batches < 1:
            raise ValueError("claims_in_flight and flush_batches must be at least 1")
        #: Todos claimed ahead of free slots (None: ``concurrency``, at least MIN_PREFETCH, at most 100).
        self._prefetch = prefetch
        self.claims_in_flight = claims_in_flight
        self.flush_batches = flush_batches
        self.client = client if client is not None else Client()
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.flush_seconds = flush_seconds
        self.name = name or f"{os.uname().nodename.split('.')[0][:60]}-{os.getpid()}"
        #: Exit once a claim comes back empty and nothing is running (scripts, tests).
        self.drain = drain
        self.stats = Stats()
        #: Why the worker stopped on its own (a refused token, queues outside its scopes), if it did.
        self.error: SwitchboardError | None = None
        self._handlers: dict[str, _Handler] = {}
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def prefetch(self) -> int:
        return min(max(self.concurrency, MIN_PREFETCH), MAX_CLAIM) if self._prefetch is None else self._prefetch

    @prefetch.setter
    def prefetch(self, value: int | None) -> None:
        if value is not None and not 0 <= value <= MAX_CLAIM:
            raise ValueError(f"prefetch must be between 0 and {MAX_CLAIM}")
        self._prefetch = value

    # --- registration ----------------------------------------------------------------------------------
    def handler(self, kind: str) -> Callable[[H], H]:
        """Register a function (sync or async) for todos of ``kind`` ("*": any kind without its own).
        It takes the todo, or the todo and its ``Context``; its return value is the todo's result."""

        def register(function: H) -> H:
            self.add_handler(kind, function)
            return function

        return register

    def add_handler(self, kind: str, function: Callable[..., Any]) -> None:
        self._handlers[kind] = _Handler(
            function, inspect.iscoroutinefunction(function), wants_context=_positional(function) >= 2
        )

    # --- running ---------------------------------------------------------------------------------------
    def run(self) -> Stats:
        """Run until SIGTERM/SIGINT (a second one skips the grace); returns the counts."""
        return asyncio.run(self.arun(signals=True))

    def stop(self) -> None:
        """Stop claiming and drain (thread-safe). A second call releases what is still running at once."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        assert self._stopping is not None and self._hurry is not None
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()

    async def arun(self, *, signals: bool = False) -> Stats:
        if not self._handlers:
            raise RuntimeError("no handlers: register one with @worker.handler(kind)")
        self._loop = asyncio.get_running_loop()
        self._stopping, self._hurry = asyncio.Event(), asyncio.Event()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._request_stop)
        own_client = not isinstance(self.client, AsyncClient)
        api = self._async_client()
        threads = _Threads(self.concurrency) if any(not h.is_async for h in self._handlers.values()) else None
        completions = _Completions(api, self.flush_seconds, self.flush_batches, self.stats)
        flusher = asyncio.create_task(completions.run())
        running: dict[asyncio.Task[None], Context] = {}
        try:
            await self._claim_loop(api, threads, completions, running)
            await self._drain(api, running)
        finally:
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
            await completions.close()
            await flusher
            if threads is not None:
                threads.stop()
            if own_client:
                await api.aclose()
        log.info("worker %s stopped: %s", self.name, self.stats)
        return self.stats

    def _async_client(self) -> AsyncClient:
        client = self.client
        if isinstance(client, AsyncClient):
            return client
        return AsyncClient(client.url, client.token, timeout=client.timeout, retries=client.retries)

    async def _claim_loop(
        self,
        api: AsyncClient,
        threads: _Threads | None,
        completions: _Completions,
        running: dict[asyncio.Task[None], Context],
    ) -> None:
        """Keep ``concurrency`` handlers running and up to ``prefetch`` todos claimed ahead of them, with up
        to ``claims_in_flight`` claims on their way at once. A claim long-polls only when the last answer
        was empty (one claim in flight then); a prefetched todo not started within a third of its lease
        (before its first heartbeat would be due) is released, never left to lapse."""
        assert self._stopping is not None
        stopping = asyncio.create_task(self._stopping.wait())
        changed = asyncio.Event()  # a handler finished, a claim was answered
        # A claim on its way -> (its limit, when it was sent, how many handlers had finished then).
        claims: dict[asyncio.Task[list[Todo]], tuple[int, float, int]] = {}
        ahead: collections.deque[tuple[Todo, float]] = collections.deque()  # claimed, not started; sent at
        empty = False  # the last claim answered found nothing
        finished = [0]  # handlers finished so far
        finished_at_empty = 0  # ... when the claim whose answer was the last empty one was sent
        look_again_at = 0.0  # an idle worker that does not long-poll looks again then
        stale_after = self.lease_seconds / 3
        client = self.client if isinstance(self.client, Client) else None
        # After stale todos were released, no claiming ahead until a handler starts one: handlers that
        # are slow claim no more than they can start.
        held_back = [False]

        def done(task: asyncio.Task[None]) -> None:
            running.pop(task, None)
            finished[0] += 1
            changed.set()

        def start(todo: Todo, claimed_at: float) -> None:
            held_back[0] = False
            ctx = Context(todo, _client=client, _api=api)
            task = asyncio.create_task(self._work(api, threads, completions, ctx, time.monotonic() - claimed_at))
            running[task] = ctx
            task.add_done_callback(done)

        def may_claim(now: float) -> bool:
            if self.error is not None:
                return False
            if not empty:
                return len(claims) < self.claims_in_flight
            if claims:  # after an empty answer, one claim at a time: a long-poll, or the next look
                return False
            if not self.drain and self.poll_seconds > 0:
                return True  # the long-poll
            # No long-poll (draining, or poll 0): look again once a handler finishes, or after a pause.
            return finished[0] > finished_at_empty or (not self.drain and now >= look_again_at)

        try:
            while not self._stopping.is_set():
                while ahead and len(running) < self.concurrency:
                    start(*ahead.popleft())
                now = time.monotonic()
                stale = []
                while ahead and now - ahead[0][1] >= stale_after:
                    stale.append(ahead.popleft()[0])
                if stale:
                    held_back[0] = True
                    log.info("releasing %d prefetched todo(s) not started within a third of the lease", len(stale))
                    await self._give_back_all(api, stale)
                in_claims = sum(limit for limit, _, _ in claims.values())
                bound = self.concurrency + (0 if held_back[0] else self.prefetch)
                wanted = bound - len(running) - len(ahead) - in_claims
                # A claim asks for a share of the bound (so that claims_in_flight of them overlap), and
                # goes once that share is wanted, or at once when a slot would otherwise stay idle.
                share = min(MAX_CLAIM, -(-(self.concurrency + self.prefetch) // self.claims_in_flight))
                idle_slot = not ahead and len(running) + in_claims < self.concurrency
                if wanted > 0 and (wanted >= share or idle_slot or empty) and may_claim(now):
                    long_poll = empty and not self.drain and self.poll_seconds > 0
                    limit = min(wanted, share)
                    claim = asyncio.create_task(
                        api.claim(
                            self.queues,
                            limit=limit,
                            lease_seconds=self.lease_seconds,
                            wait_seconds=self.poll_seconds if long_poll else None,
                            worker=self.name,
                        )
                    )
                    claims[claim] = (limit, now, finished[0])
                    claim.add_done_callback(lambda _: changed.set())
                    continue
                # Nothing to send now: wait for a finished handler, an answer, the stop, the oldest
                # prefetched todo going stale, or an idle worker's next look.
                timeouts = [stale_after - (now - ahead[0][1])] if ahead else []
                if empty and not claims and not self.drain and self.poll_seconds <= 0:
                    timeouts.append(look_again_at - now)
                if not changed.is_set():
                    waiter = asyncio.create_task(changed.wait())
                    timeout = max(0.0, min(timeouts)) if timeouts else None
                    await asyncio.wait([stopping, waiter], timeout=timeout, return_when="FIRST_COMPLETED")
                    waiter.cancel()
                changed.clear()
                for claim in [c for c in claims if c.done()]:
                    _, sent_at, finished_at_send = claims.pop(claim)
                    try:
                        todos = claim.result()
                    except (Unauthorized, Forbidden, Invalid, NotFound) as exc:
                        log.error("claim refused (%s): %s", exc.status, exc)
                        self.error = exc
                        continue
                    except SwitchboardError as exc:
                        log.warning("claim failed (%s); retrying in 1 s", exc)
                        await asyncio.wait([stopping], timeout=1.0)
                        continue
                    self.stats.claimed += len(todos)
                    # The lease began at the server between the send and the answer: counted from the send.
                    ahead.extend((todo, sent_at) for todo in todos)
                    empty = not todos
                    if empty:
                        finished_at_empty = finished_at_send
                        look_again_at = time.monotonic() + IDLE_RECLAIM_SECONDS
                if self.error is not None and not claims:
                    return  # what was claimed before the refusal is given back below
                # Draining: done once a claim sent after the last handler finished found nothing (a
                # handler's fail or release may have made its todo claimable again).
                settled = finished[0] == finished_at_empty
                if self.drain and empty and settled and not running and not ahead and not claims:
                    return
        finally:
            stopping.cancel()
            # Answers on their way as the stop came: a claim the server has answered may still be in
            # transit, and a hang-up then would leave its todos leased until they lapse; wait a moment for
            # it (its todos are given back below). A long-poll still waiting after that is hung up on, and
            # the server releases whatever it takes for a caller who left.
            if claims:
                await asyncio.wait(list(claims), timeout=ANSWER_IN_FLIGHT_SECONDS)
            unstarted = [todo for todo, _ in ahead]
            for claim in claims:
                if not claim.done():
                    claim.cancel()
                    with contextlib.suppress(asyncio.CancelledError, SwitchboardError):
                        await claim
                elif not claim.cancelled() and claim.exception() is None:
                    self.stats.claimed += len(claim.result())
                    unstarted.extend(claim.result())
            await self._give_back_all(api, unstarted)

    async def _give_back_all(self, api: AsyncClient, todos: list[Todo]) -> None:
        """Release todos claimed but never started, a few at a time."""
        for i in range(0, len(todos), 16):
            await asyncio.gather(*(self._give_back(api, todo) for todo in todos[i : i + 16]))

    async def _drain(self, api: AsyncClient, running: dict[asyncio.Task[None], Context]) -> None:
        assert self._hurry is not None
        if running:
            log.info("stopping: %d handler(s) running, %.0f s grace", len(running), self.grace_seconds)
            hurry = asyncio.create_task(self._hurry.wait())
            deadline = time.monotonic() + self.grace_seconds
            while running and not hurry.done() and (remaining := deadline - time.monotonic()) > 0:
                await asyncio.wait([*running, hurry], timeout=remaining, return_when="FIRST_COMPLETED")
            hurry.cancel()
        left = list(running.items())
        for task, ctx in left:
            ctx._lose("released")  # its outcome, if it ever comes, is not sent
            task.cancel()
        for _, ctx in left:
            await self._give_back(api, ctx.todo)
        if left:
            await asyncio.wait([t for t, _ in left], timeout=1.0)

    async def _give_back(self, api: AsyncClient, todo: Todo) -> None:
        try:
            await api.release(todo)
            self.stats.released += 1
            log.info("released %s", todo.id)
        except SwitchboardError as exc:
            log.warning("could not release %s (%s); its lease will lapse", todo.id, exc)

    async def _work(
        self, api: AsyncClient, threads: _Threads | None, completions: _Completions, ctx: Context, age: float = 0.0
    ) -> None:
        """Run the todo's handler; ``age``: seconds since its claim was sent (a prefetched todo's lease
        has been running that long, so its first heartbeat comes that much sooner)."""
        todo = ctx.todo
        handler = self._handlers.get(todo.kind) or self._handlers.get(ANY_KIND)
        if handler is None:
            await self._fail(api, ctx, f"no handler for kind {todo.kind!r} in worker {self.name}", None)
            return
        wake, stop = asyncio.Event(), asyncio.Event()
        ctx._wake = functools.partial(asyncio.get_running_loop().call_soon_threadsafe, wake.set)
        beat = asyncio.create_task(self._heartbeat(api, ctx, wake, stop, age))

        async def end_beat() -> None:
            # Let a heartbeat on its way land before the outcome: it may carry the last checkpoint, and
            # the outcome after it would make it a 409. What it has not taken, _send_report sends.
            stop.set()
            wake.set()
            await asyncio.wait([beat])

        try:
            args = (todo, ctx) if handler.wants_context else (todo,)
            if handler.is_async:
                result = await handler.function(*args)
            else:
                assert threads is not None
                result = await threads.run(lambda: handler.function(*args))
        except Release:
            await end_beat()
            outcome = "release"
        except Wait as wait:
            await end_beat()
            if ctx.lease_lost:
                self._dropped(ctx)
            else:
                await self._send_report(api, ctx)
                await self._wait(api, ctx, wait)
            return
        except Exception as exc:  # the handler's failure becomes the todo's error
            await end_beat()
            if ctx.lease_lost:
                self._dropped(ctx)
                return
            retry_in = getattr(exc, "retry_in", None)
            await self._send_report(api, ctx)
            await self._fail(api, ctx, f"{exc.__class__.__name__}: {exc}", retry_in)
            return
        else:
            outcome = "complete"
        finally:
            beat.cancel()
        if ctx.lease_lost:
            self._dropped(ctx)
        elif outcome == "complete":
            if ctx._usage:  # the last usage goes first: a batch completion carries none
                await self._send_report(api, ctx)
            completions.add(ctx, result)
        else:
            await self._send_report(api, ctx)
            try:
                await api.release(todo)
                self.stats.released += 1
            except Conflict as exc:
                ctx._lose(exc.state)
                self._dropped(ctx)

    async def _wait(self, api: AsyncClient, ctx: Context, wait: Wait) -> None:
        try:
            waiting = await api.wait(ctx.todo, **wait.arguments)
        except Conflict as exc:
            ctx._lose(exc.state)
            self._dropped(ctx)
            return
        except SwitchboardError as exc:  # a bad wait (400, 404) fails the todo with the reason
            await self._fail(api, ctx, f"Wait refused: {exc}", None)
            return
        self.stats.waited += 1
        if wait.on_waiting is not None:
            try:
                wait.on_waiting(waiting)
            except Exception:  # the wait stands; a broken callback is the handler's to fix
                log.exception("on_waiting of %s raised", ctx.todo.id)

    async def _send_report(self, api: AsyncClient, ctx: Context) -> None:
        """A checkpoint (or progress) the handler left unsent before it failed or released: the next
        claimer resumes from it, so it goes first."""
        if report := ctx._take():
            try:
                await api.heartbeat(ctx.todo, lease_seconds=self.lease_seconds, **report)
            except SwitchboardError as exc:
                log.warning("could not send the last checkpoint of %s (%s)", ctx.todo.id, exc)

    def _dropped(self, ctx: Context) -> None:
        if ctx.lost_state != "released":
            self.stats.lost += 1
            log.warning("lease on %s lost (%s): its outcome is not sent", ctx.todo.id, ctx.lost_state)

    async def _fail(self, api: AsyncClient, ctx: Context, error: str, retry_in: float | None) -> None:
        try:
            await api.fail(ctx.todo, error=error[:10_000], retry_in_seconds=retry_in)
            self.stats.failed += 1
        except Conflict as exc:
            ctx._lose(exc.state)
            self._dropped(ctx)
        except SwitchboardError as exc:
            log.warning("could not fail %s (%s); its lease will lapse", ctx.todo.id, exc)

    async def _heartbeat(
        self, api: AsyncClient, ctx: Context, wake: asyncio.Event, stop: asyncio.Event, age: float = 0.0
    ) -> None:
        # A third of the lease from the claim: two beats can be lost before it lapses. A progress or
        # checkpoint the handler wants sent now wakes the beat early.
        interval = max(0.0, self.lease_seconds / 3 - age)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), interval)
            wake.clear()
            if stop.is_set():
                return
            started = time.monotonic()
            report = ctx._take()
            try:
                beat = await api.heartbeat(ctx.todo, lease_seconds=self.lease_seconds, **report)
                ctx.budget_exhausted = bool(beat.extra.get("budget_exhausted"))
            except Conflict as exc:
                ctx._lose(exc.state or "conflict")
                return
            except Invalid as exc:  # a bad progress or checkpoint: dropped, the lease still kept
                log.warning("heartbeat on %s refused its report (%s); sent without it", ctx.todo.id, exc)
                with contextlib.suppress(SwitchboardError):
                    await api.heartbeat(ctx.todo, lease_seconds=self.lease_seconds)
            except SwitchboardError as exc:
                ctx._give_back(report)
                log.warning("heartbeat on %s failed (%s)", ctx.todo.id, exc)
            interval = max(0.0, self.lease_seconds / 3 - (time.monotonic() - started))


class _Completions:
    """Completions sent together. One is sent at once when nothing else is on its way; while up to
    ``batches`` batches are on their way the next gathers (so a batch is as large as the load makes it,
    at no wait when idle). ``delay`` > 0 lets a completion wait that long for company. A crash loses only
    what was not sent: those todos run again once their leases lapse."""

    def __init__(self, api: AsyncClient, delay: float, batches: int, stats: Stats) -> None:
        self.api = api
        self.delay = delay
        self.stats = stats
        self.pending: list[tuple[Context, JSON]] = []
        self.ready = asyncio.Event()
        self.closed = False
        self.slots = asyncio.Semaphore(batches)
        self.sending: set[asyncio.Task[None]] = set()

    def add(self, ctx: Context, result: JSON) -> None:
        self.pending.append((ctx, result))
        self.ready.set()

    async def close(self) -> None:
        self.closed = True
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            if self.delay > 0 and not self.closed and len(self.pending) < MAX_BATCH:
                await asyncio.sleep(self.delay)
            await self.slots.acquire()  # a batch on its way per slot; meanwhile the next gathers
            batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            if not self.pending and not self.closed:
                self.ready.clear()
            if batch:
                task = asyncio.create_task(self._send(batch))
                self.sending.add(task)
                task.add_done_callback(self.sending.discard)
            else:
                self.slots.release()
                if self.closed:
                    if self.sending:
                        await asyncio.wait(list(self.sending))
                    if not self.pending:
                        return

    async def _send(self, batch: list[tuple[Context, JSON]]) -> None:
        try:
            await self._send_batch(batch)
        finally:
            self.slots.release()

    async def _send_batch(self, batch: list[tuple[Context, JSON]]) -> None:
        try:
            outcomes = await self.api.complete_many([(ctx.todo, None, result) for ctx, result in batch])
        except SwitchboardError as exc:
            log.warning("could not send %d completion(s) (%s); their leases will lapse", len(batch), exc)
            return
        for (ctx, _), outcome in zip(batch, outcomes, strict=True):
            if outcome.ok:
                self.stats.completed += 1
            else:
                ctx._lose(outcome.error.state if outcome.error else None)
                self.stats.lost += 1
                log.warning("completion of %s refused: %s", ctx.todo.id, outcome.error)
