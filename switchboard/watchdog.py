"""Each web process watches its own request path and exits when it stops moving, so gunicorn replaces it.

gunicorn's own timeout does not see a stuck uvicorn worker: the worker heartbeats from its event loop,
which may be idle while the pool of threads behind it (switchboard/executor.py) is stuck, and a blocked
loop is found only after GUNICORN_TIMEOUT (60 s, above the longest long-poll). So a daemon thread of
each process checks, every WATCHDOG_INTERVAL_SECONDS, the two things a request needs:

- the event loop: a callback the thread schedules on it must run;
- the pool: with work queued or running, some task must finish (executor.progress).

If either has not moved for WATCHDOG_SECONDS, the process is stuck: the thread logs which, dumps every
thread's stack to stderr (for the post mortem) and ends the process at once. gunicorn starts a fresh
worker; /healthz fails meanwhile.

Why progress and not a probe through the pool (issue 28): a probe queued behind the pool's work measures
the queue, not whether it moves. A pool saturated by requests that finish (one agent's burst of slow
requests, thousands of refused ones) kept a probe waiting past the window, and the watchdog then killed
every long-poll and await of the process: a denial of service any one token could cause. A pool that
finishes nothing while work waits is stuck, whatever the queue; a busy one is not.

The check asks nothing of the database: an outage is not a stuck process, and restarting every
worker would not end it (/readyz reports it). /healthz, answered from the pool, adds a database round
trip bounded by a statement timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time

from django.conf import settings

from switchboard import executor

logger = logging.getLogger(__name__)

# Not 3 or 4: gunicorn's master stops altogether when a worker exits with those (boot errors).
EXIT_CODE = 70


class Watchdog:
    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, interval: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.interval = interval
        self.loop_seen = self.pool_seen = time.monotonic()
        self._finished = -1
        self.stopped = threading.Event()
        self._pid = os.getpid()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="switchboard-watchdog", daemon=True).start()

    def stalled(self) -> tuple[str, float]:
        """Which of the loop and the pool has gone longer without moving, and for how long (seconds)."""
        now = time.monotonic()
        loop, pool = now - self.loop_seen, now - self.pool_seen
        return ("event loop", loop) if loop >= pool else (f"pool of {settings.WEB_THREADS} threads", pool)

    def _loop_moved(self) -> None:
        self.loop_seen = time.monotonic()

    def _check_pool(self) -> None:
        finished, outstanding = executor.progress.read()
        if finished != self._finished or outstanding == 0:
            self._finished = finished
            self.pool_seen = time.monotonic()

    def _watch(self) -> None:
        while not self.stopped.wait(self.interval):
            if os.getpid() != self._pid:  # a forked child inherits no threads, but be sure
                return
            with contextlib.suppress(RuntimeError):  # the loop closed: the process is stopping
                self.loop.call_soon_threadsafe(self._loop_moved)
            self._check_pool()
            what, stalled = self.stalled()
            if stalled > self.timeout:
                self._fail(what, stalled)

    def _fail(self, what: str, stalled: float) -> None:
        logger.critical(
            "request path stuck for %.1f s (the %s has not moved); exiting so that gunicorn replaces this "
            "worker (pid %d); stacks follow on stderr",
            stalled,
            what,
            os.getpid(),
        )
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(EXIT_CODE)


watchdog: Watchdog | None = None


# --- ASGI lifespan (settings.ASGI_LIFESPAN) -------------------------------------------------------
async def startup() -> None:
    global watchdog
    if settings.WATCHDOG_SECONDS <= 0:
        return
    if watchdog is not None:
        watchdog.stopped.set()
    watchdog = Watchdog(asyncio.get_running_loop(), settings.WATCHDOG_SECONDS, min(1.0, settings.WATCHDOG_SECONDS / 4))
    watchdog.start()


async def shutdown() -> None:
    # From here the loop stops serving and the process ends; gunicorn's graceful timeout bounds that.
    if watchdog is not None:
        watchdog.stopped.set()
