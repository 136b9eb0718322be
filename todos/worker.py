"""The in-process worker: handlers run inside a Django process, claiming and completing through the queue
service directly (no HTTP), as ``manage.py work`` runs it (todos/management/commands/work.py).

    worker = Worker(agent, handler, queues=["email"], concurrency=8)
    worker.run()            # until stop() (the command: SIGTERM/SIGINT), or the queues are empty (drain)

Threads, each with its own database connection (Django's are per thread):
- one claimer keeps up to ``concurrency + prefetch`` todos claimed: ``queue.claim_next(limit=n)``, one
  statement for a batch, sent once a batch's worth of room is free (or at once when a slot would idle);
- ``concurrency`` handler threads take todos in claim order. A prefetched todo not started within a third
  of its lease (before its first heartbeat would be due) is released (``queue.release``), never left to
  lapse;
- one completer sends what the handlers finished with ``queue.complete_many``: at once when nothing is
  on its way, else together with whatever finished meanwhile (at most MAX_COMPLETE_BATCH a statement);
- one heartbeater extends the leases of handlers that run longer than a third of their lease.

Fencing and leases are the queue service's, unchanged: every complete, fail, release and heartbeat
carries the receipt of its claim, so a todo whose lease lapsed and was claimed again is not completed by
this worker (``stats.lost``). At-least-once, as the queue is: a process killed mid-batch leaves its todos
claimed until their leases lapse, then they are claimed again (attempt + 1).

A handler takes the todo (a ``todos.models.Todo``) and returns its result (JSON). An exception fails the
todo (retry with backoff, or after its ``retry_in`` attribute's seconds; a dead-letter at the cap).
"""

from __future__ import annotations

import collections
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, close_old_connections, connection

from todos import queue
from todos.errors import QueueError
from todos.limits import MAX_CLAIM_BATCH, MAX_COMPLETE_BATCH, MAX_ERROR_CHARS
from todos.models import Agent, Todo

log = logging.getLogger("switchboard.worker")

Handler = Callable[[Todo], Any]

# An idle worker (its last claim found nothing) claims again after this, doubling up to poll_seconds.
IDLE_FIRST_POLL_SECONDS = 0.05
# The default prefetch: the concurrency, but at least this (one claim statement's cost over several todos).
MIN_PREFETCH = 10
# After a database error, the thread that met it waits this long before its next statement.
ERROR_PAUSE_SECONDS = 1.0


@dataclass
class Stats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    #: Given back unstarted: prefetched todos gone stale, and what was left at the stop.
    released: int = 0
    #: Outcomes refused because the lease was gone (lapsed and claimed again, or cancelled).
    lost: int = 0


def load_handler(target: str) -> Handler:
    """``module:function`` -> the function."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{target!r}: expected module:function")
    function = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(function):
        raise ValueError(f"{target!r}: {attribute} is not a function of {module_name}")
    return function  # type: ignore[no-any-return]


def default_name() -> str:
    return f"{os.uname().nodename.split('.')[0][:60]}-{os.getpid()}"


class Worker:
    """Runs ``handler`` for the todos of ``queues`` (names or globs within ``agent``'s claim scopes; None:
    all of them), ``concurrency`` at once, with up to ``prefetch`` (default: ``concurrency``, at least
    MIN_PREFETCH, at most MAX_CLAIM_BATCH) claimed ahead. ``drain``: stop once a claim finds nothing and
    nothing runs."""

    def __init__(
        self,
        agent: Agent,
        handler: Handler,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        prefetch: int | None = None,
        lease_seconds: float = 60.0,
        poll_seconds: float = 1.0,
        grace_seconds: float = 30.0,
        name: str | None = None,
        drain: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        prefetch = min(max(concurrency, MIN_PREFETCH), MAX_CLAIM_BATCH) if prefetch is None else prefetch
        if not 0 <= prefetch <= MAX_CLAIM_BATCH:
            raise ValueError(f"prefetch must be between 0 and {MAX_CLAIM_BATCH}")
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.agent = agent
        self.handler = handler
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.name = name or default_name()
        self.drain = drain
        self.stats = Stats()
        #: Why the worker stopped on its own (its queues refused), if it did.
        self.error: QueueError | None = None
        self._lock = threading.Condition()
        self._ahead: collections.deque[tuple[Todo, float]] = collections.deque()  # claimed, not started
        self._running: dict[str, tuple[Todo, float]] = {}  # id -> (todo, when its lease was last renewed)
        self._done: list[tuple[Todo, Any]] = []  # finished, completion not yet sent
        self._claiming = True  # the claimer is still at work
        self._handlers_alive = concurrency
        self._held_back = False  # prefetch held back: stale todos were released, no handler has freed since
        self._finished = 0  # todos that left _running (completed, failed or given back)
        self._stopping = threading.Event()
        self._hurry = threading.Event()

    # --- control ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running handlers get ``grace_seconds``, what is not started is released. A second
        call skips the grace. Thread-safe (a signal handler may call it)."""
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()

    def run(self) -> Stats:
        """Run until ``stop()`` or, draining, until the queues are empty; returns the counts."""
        claimer = threading.Thread(target=self._thread, args=(self._claimer,), name="claimer", daemon=True)
        handlers = [
            threading.Thread(target=self._thread, args=(self._handle,), name=f"handler-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        completer = threading.Thread(target=self._thread, args=(self._completer,), name="completer", daemon=True)
        beater = threading.Thread(target=self._thread, args=(self._heartbeater,), name="heartbeat", daemon=True)
        for thread in [claimer, *handlers, completer, beater]:
            thread.start()
        while claimer.is_alive():  # ends at the stop or, draining, once the queues are empty
            claimer.join(0.2)  # a timeout: the main thread takes signals between joins
        deadline = time.monotonic() + self.grace_seconds if self._stopping.is_set() else None
        for thread in handlers:
            while thread.is_alive() and not self._hurry.is_set():
                if deadline is None and self._stopping.is_set():
                    deadline = time.monotonic() + self.grace_seconds
                if deadline is not None and time.monotonic() >= deadline:
                    break
                thread.join(0.1)
        stuck = any(thread.is_alive() for thread in handlers)
        if stuck:
            self._hurry.set()  # the completer sends what finished, then goes; the heartbeats stop
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        completer.join()
        beater.join()
        if stuck:
            self._release_running()
        log.info("worker %s stopped: %s", self.name, self.stats)
        return self.stats

    def _thread(self, body: Callable[[], None]) -> None:
        try:
            body()
        finally:
            connection.close()

    # --- claiming --------------------------------------------------------------------------------------
    def _claimer(self) -> None:
        idle = 0.0
        target = self.concurrency + self.prefetch
        batch = max(1, min(MAX_CLAIM_BATCH, (target + 1) // 2))  # two batches make the bound
        try:
            while not self._stopping.is_set():
                self._release_stale()  # here too: every handler may be busy for longer than a lease
                with self._lock:
                    # Prefetch is held back after a release of stale ones, until a handler starts a todo:
                    # handlers that slow claim no more than they can start.
                    bound = self.concurrency if self._held_back else target
                    room = bound - len(self._ahead) - len(self._running)
                    idle_slot = not self._ahead and len(self._running) < self.concurrency
                    if room <= 0 or (room < batch and not idle_slot):
                        # A handler taking a todo, or a todo leaving, wakes it; else the oldest going stale.
                        age = time.monotonic() - self._ahead[0][1] if self._ahead else 0.0
                        self._lock.wait(min(0.5, max(0.01, self.lease_seconds / 3 - age)))
                        continue
                    finished_before = self._finished
                sent = time.monotonic()  # the lease starts during the claim: counted from before it
                try:
                    todos = queue.claim_next(
                        agent=self.agent,
                        queues=self.queues,
                        limit=min(room, MAX_CLAIM_BATCH),
                        lease_seconds=self.lease_seconds,
                        worker=self.name,
                    )
                except QueueError as exc:  # queues outside the agent's scopes: not curable by waiting
                    log.error("claim refused: %s", exc)
                    self.error = exc
                    return
                except DatabaseError as exc:
                    log.warning("claim failed (%s); retrying in %.0f s", exc, ERROR_PAUSE_SECONDS)
                    close_old_connections()
                    self._stopping.wait(ERROR_PAUSE_SECONDS)
                    continue
                with self._lock:
                    self.stats.claimed += len(todos)
                    self._ahead.extend((todo, sent) for todo in todos)
                    self._lock.notify_all()
                    if todos:
                        idle = 0.0
                        continue
                    # Draining: done once a claim sent after the last todo left found nothing (a failed
                    # todo may be claimable again at once).
                    if self.drain and not self._running and not self._ahead and self._finished == finished_before:
                        return
                    if self.drain and self._running:
                        self._lock.wait(0.5)  # the next look once a todo leaves
                        continue
                idle = min(self.poll_seconds, idle * 2 or IDLE_FIRST_POLL_SECONDS)
                self._stopping.wait(idle)
        finally:
            with self._lock:
                self._claiming = False
                left = [todo for todo, _ in self._ahead]
                self._ahead.clear()
                self._lock.notify_all()
            self._release(left)

    def _release(self, todos: list[Todo]) -> None:
        for todo in todos:
            assert todo.lease_id is not None
            try:
                queue.release(todo.id, agent=self.agent, lease_id=todo.lease_id)
                self._count("released")
            except (QueueError, DatabaseError) as exc:
                log.warning("could not release %s (%s); its lease will lapse", todo.id, exc)

    # --- handling --------------------------------------------------------------------------------------
    def _release_stale(self) -> None:
        """Give back prefetched todos not started within a third of their lease: their first heartbeat
        would be due, and another worker may run them now."""
        stale_after = self.lease_seconds / 3
        now = time.monotonic()
        with self._lock:
            stale = []
            while self._ahead and now - self._ahead[0][1] >= stale_after:
                stale.append(self._ahead.popleft()[0])
        if stale:
            self._held_back = True
            log.info("releasing %d prefetched todo(s) not started within a third of the lease", len(stale))
            self._release(stale)

    def _next(self) -> tuple[Todo, float] | None:
        """The next todo to start (None: nothing more will come), skipping the stale ones."""
        while True:
            self._release_stale()
            with self._lock:
                if self._ahead and not self._stopping.is_set():
                    todo, claimed_at = self._ahead.popleft()
                    self._running[todo.id] = (todo, claimed_at)
                    self._held_back = False
                    self._lock.notify_all()  # room for the claimer
                    return todo, claimed_at
                if not self._claiming or self._stopping.is_set():
                    return None
                self._lock.wait(0.5)

    def _handle(self) -> None:
        try:
            while (item := self._next()) is not None:
                todo, _ = item
                try:
                    result = self.handler(todo)
                except Exception as exc:  # the handler's failure becomes the todo's error
                    self._fail(todo, exc)
                    continue
                finally:
                    close_old_connections()
                with self._lock:
                    self._done.append((todo, result))
                    self._lock.notify_all()
        finally:
            with self._lock:
                self._handlers_alive -= 1
                self._lock.notify_all()

    def _count(self, name: str) -> None:
        with self._lock:  # several threads count
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _left(self, todo: Todo) -> None:
        with self._lock:
            if self._running.pop(todo.id, None) is not None:
                self._finished += 1
            self._lock.notify_all()

    def _fail(self, todo: Todo, exc: Exception) -> None:
        assert todo.lease_id is not None
        retry_in = getattr(exc, "retry_in", None)
        try:
            queue.fail(
                todo.id,
                agent=self.agent,
                lease_id=todo.lease_id,
                error=f"{exc.__class__.__name__}: {exc}"[:MAX_ERROR_CHARS],
                retry_in_seconds=float(retry_in) if isinstance(retry_in, int | float) else None,
            )
            self._count("failed")
        except QueueError as refused:
            self._count("lost")
            log.warning("fail of %s refused: %s", todo.id, refused)
        except DatabaseError as error:
            log.warning("could not fail %s (%s); its lease will lapse", todo.id, error)
        self._left(todo)

    # --- completing ------------------------------------------------------------------------------------
    def _completer(self) -> None:
        """Sends at once what is done; what finishes meanwhile goes in the next statement."""
        while True:
            with self._lock:
                while not self._done:
                    if self._handlers_alive == 0 or self._hurry.is_set():
                        return
                    self._lock.wait(0.5)
                batch, self._done = self._done[:MAX_COMPLETE_BATCH], self._done[MAX_COMPLETE_BATCH:]
            self._complete(batch)

    def _complete(self, batch: list[tuple[Todo, Any]]) -> None:
        items = [(todo.id, todo.lease_id or "", result) for todo, result in batch]
        try:
            outcomes = queue.complete_many(items, agent=self.agent)
        except DatabaseError as exc:
            log.warning("could not send %d completion(s) (%s); their leases will lapse", len(batch), exc)
            close_old_connections()
            outcomes = []
        with self._lock:
            for todo, _ in batch:
                if self._running.pop(todo.id, None) is not None:
                    self._finished += 1
            for outcome in outcomes:
                if isinstance(outcome, Todo):
                    self.stats.completed += 1
                else:
                    self.stats.lost += 1
                    log.warning("completion refused: %s", outcome)
            self._lock.notify_all()

    # --- leases ----------------------------------------------------------------------------------------
    def _heartbeater(self) -> None:
        interval = self.lease_seconds / 3
        while not self._stopping.wait(min(interval / 4, 1.0)) or self._running_left():
            if self._hurry.is_set():
                return
            now = time.monotonic()
            with self._lock:
                due = [(todo, at) for todo, at in self._running.values() if now - at >= interval]
            for todo, _ in due:
                assert todo.lease_id is not None
                try:
                    queue.heartbeat(todo.id, agent=self.agent, lease_id=todo.lease_id, lease_seconds=self.lease_seconds)
                except QueueError as exc:
                    log.warning("heartbeat on %s refused (%s): its outcome will be refused too", todo.id, exc)
                    continue
                except DatabaseError as exc:
                    log.warning("heartbeat on %s failed (%s)", todo.id, exc)
                    close_old_connections()
                    continue
                with self._lock:
                    if todo.id in self._running:
                        self._running[todo.id] = (todo, now)

    def _running_left(self) -> bool:
        with self._lock:
            return bool(self._running) and not self._hurry.is_set()

    def _release_running(self) -> None:
        """After the grace: give back what handlers still hold (their outcomes, if they come, are refused)."""
        with self._lock:
            left = [todo for todo, _ in self._running.values()]
            self._running.clear()
        self._release(left)
