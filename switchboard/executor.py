"""The web process's bounded pool of threads for sync work, and the one way async code runs sync code.

Under the ASGI server, every sync request (the whole middleware chain and its view, in one hop: see
switchboard/asgi.py) and every statement that an async view, a long-poll or an MCP tool runs go to one
ThreadPoolExecutor of ``settings.WEB_THREADS`` threads. Each thread keeps one persistent database
connection (CONN_MAX_AGE, checked before each hop), so a process holds at most WEB_THREADS connections
plus the listener's (todos/listener.py), however many requests wait.

Why it cannot deadlock: nothing that runs in these threads waits for the event loop (no async_to_sync in a
request: async views run on the loop), so a thread only ever waits for the database and then finishes.
When every thread is busy, requests queue in the loop, holding no thread. The watchdog
(switchboard/watchdog.py) replaces a process whose pool or loop stops moving anyway.

Outside an ASGI server (the test client, runserver, a WSGI deployment, a management command) there is
no such loop: ``run`` then runs the call in the calling request's own thread (asgiref's thread-sensitive
mode, under the request's async_to_sync), on that thread's connection, as Django would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

P = ParamSpec("P")
T = TypeVar("T")

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_loop: asyncio.AbstractEventLoop | None = None


class Progress:
    """What the pool has been given and has finished, for the watchdog (switchboard/watchdog.py): a pool
    with work outstanding whose finished count moves is busy, not stuck, however long its queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.submitted = 0
        self.finished = 0

    def submit(self) -> None:
        with self._lock:
            self.submitted += 1

    def finish(self) -> None:
        with self._lock:
            self.finished += 1

    def read(self) -> tuple[int, int]:
        """(tasks finished so far, tasks queued or running now)."""
        with self._lock:
            return self.finished, self.submitted - self.finished


progress = Progress()


class _CountingPool(concurrent.futures.ThreadPoolExecutor):
    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        progress.submit()
        try:
            return super().submit(_counted, fn, *args, **kwargs)
        except BaseException:  # refused (the pool is shut down): nothing will run
            progress.finish()
            raise


def _counted(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        progress.finish()


def serve(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` (the ASGI server's, at startup or its first request) the one whose sync work goes
    to the pool."""
    global _loop
    _loop = loop


def serving(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Whether ``loop`` (default: the running one) is the server's."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
    return loop is _loop


def executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = _CountingPool(max_workers=settings.WEB_THREADS, thread_name_prefix="switchboard-web")
    return _executor


def in_request(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``function`` as a request would, on this thread's connection: aged and health-checked before
    (request_started's work) and after (request_finished's), so a broken or old connection is not kept."""
    close_old_connections()
    try:
        return function(*args, **kwargs)
    finally:
        close_old_connections()


async def run(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run sync ``function`` in the pool (on the server's loop) or the caller's own thread (elsewhere),
    with the caller's context variables (the request id of its log lines)."""
    loop = asyncio.get_running_loop()
    if loop is not _loop:
        # That thread's request (or test) manages its connection.
        result: T = await sync_to_async(function, thread_sensitive=True)(*args, **kwargs)
        return result
    call: Callable[[], T] = functools.partial(in_request, function, *args, **kwargs)
    return await loop.run_in_executor(executor(), contextvars.copy_context().run, call)


async def run_raw(function: Callable[[], Any]) -> Any:
    """Run ``function`` in the pool as it is, with no connection handling (the sync request path, which
    sends Django's own request signals in the thread)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), contextvars.copy_context().run, function)
