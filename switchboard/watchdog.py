"""Each web process watches its own request path and exits when it stops moving, so gunicorn replaces it.

gunicorn's own timeout does not see a stuck uvicorn worker: the worker heartbeats from its event loop,
which may be idle while the pool of threads behind it (switchboard/executor.py) is stuck, and a blocked
loop is found only after GUNICORN_TIMEOUT (60 s, above the longest long-poll). So a daemon thread of
each process sends a probe every WATCHDOG_INTERVAL_SECONDS along the path a request takes: a callback
on the event loop, which hands a no-op to the pool. If no probe has come back for WATCHDOG_SECONDS, the
loop or the pool is stuck: the thread logs why, dumps every thread's stack to stderr (for the post
mortem) and ends the process at once. gunicorn starts a fresh worker; /healthz fails meanwhile.

The probe asks nothing of the database: an outage is not a stuck process, and restarting every
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
        self.last_seen = time.monotonic()
        self.stopped = threading.Event()
        self._pid = os.getpid()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="switchboard-watchdog", daemon=True).start()

    def stalled_for(self) -> float:
        """Seconds since a probe last came back through the loop and the pool."""
        return time.monotonic() - self.last_seen

    def _seen(self) -> None:
        self.last_seen = time.monotonic()

    def _probe(self) -> None:
        # On the loop: the loop moves. The pool moves when the no-op comes back.
        self.loop.run_in_executor(executor.executor(), self._seen)

    def _watch(self) -> None:
        while not self.stopped.wait(self.interval):
            if os.getpid() != self._pid:  # a forked child inherits no threads, but be sure
                return
            with contextlib.suppress(RuntimeError):  # the loop closed: the process is stopping
                self.loop.call_soon_threadsafe(self._probe)
            stalled = self.stalled_for()
            if stalled > self.timeout:
                self._fail(stalled)

    def _fail(self, stalled: float) -> None:
        logger.critical(
            "request path stuck for %.1f s (event loop or pool of %d threads); exiting so that gunicorn "
            "replaces this worker (pid %d); stacks follow on stderr",
            stalled,
            settings.WEB_THREADS,
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
