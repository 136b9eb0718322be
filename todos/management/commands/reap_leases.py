"""The sidecar: returns lapsed leases to the queue (or dead-letters them at their cap), promotes due
retries and due scheduled todos, and makes the todos of recurring schedules. Claims do not depend on it
for the first three (a claim sees lapsed leases, due retries and due scheduled todos at once); it keeps
states truthful for operators. Any number may run at once: every batch locks with SKIP LOCKED, and each
schedule's tick is made exactly once (todos/schedules.py).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections, connection

from switchboard import dberrors
from switchboard.logs import log_event
from todos import metrics, queue, retention, schedules

logger = logging.getLogger("switchboard.reaper")

# With PURGE_DAILY, how often a reaper asks the database whether today's purge has been run.
PURGE_CHECK_SECONDS = 300.0
# Sweeps in a row that fail with an error retrying cannot cure (dberrors.Failure.BROKEN: bad
# arguments, a missing table, a refused password) before the reaper exits non-zero, so that its
# supervisor shows it failing instead of a log line repeating forever. More than one: a migration
# running beside it may briefly leave a table missing.
BROKEN_SWEEPS_BEFORE_EXIT = 3


class Command(BaseCommand):
    help = "Loop the lease reaper, the promotion of due retries and scheduled todos, and the recurring schedules."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()
        self.next_purge_check = 0.0
        self.purger: threading.Thread | None = None
        self.broken_sweeps = 0
        self.last_error = ""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None, help="Seconds between sweeps.")
        parser.add_argument("--once", action="store_true", help="Make one sweep and exit.")
        parser.add_argument("--batch", type=int, default=None, help="Rows per batch.")

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"] if options["interval"] is not None else settings.REAPER_INTERVAL_SECONDS
        batch = options["batch"] or settings.REAPER_BATCH_SIZE
        if options["once"]:
            self.sweep(batch)
            if self.broken_sweeps:
                raise CommandError(f"reaper sweep cannot work: {self.last_error}")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        if settings.REAPER_METRICS_PORT:
            # The reaper is its own process (often its own container): it serves its own counters.
            from prometheus_client import start_http_server

            start_http_server(settings.REAPER_METRICS_PORT)
        logger.info("reaper started interval=%ss batch=%s", interval, batch)
        while not self.stopping.is_set():
            self.sweep(batch)
            if self.broken_sweeps >= BROKEN_SWEEPS_BEFORE_EXIT:
                self.stopping.set()
                if self.purger is not None:
                    self.purger.join(timeout=30)
                raise CommandError(f"reaper stopped: {self.broken_sweeps} sweeps failed with {self.last_error}")
            if settings.PURGE_DAILY:
                self.maybe_start_purge()
            self.stopping.wait(interval)
        if self.purger is not None:
            self.purger.join(timeout=30)
        logger.info("reaper stopped")

    def _stop(self, signum: int, frame: Any) -> None:
        # The batch in hand finishes (it is one short statement); the loop then ends.
        self.stopping.set()

    def sweep(self, batch: int) -> queue.ReapResult | None:
        close_old_connections()
        started = time.monotonic()
        try:
            result = queue.reap_once(batch=batch, should_stop=self.stopping.is_set)
            ticks = schedules.run_due_schedules()
        except DatabaseError as exc:
            # Say why once per sweep. The database down, restarting or busy: try again next time. An
            # error no retry can cure: count it, and stop after a few (handle()).
            failure = dberrors.log_failure(logger, "reaper sweep", exc)
            self.broken_sweeps = self.broken_sweeps + 1 if failure is dberrors.Failure.BROKEN else 0
            self.last_error = dberrors.describe(exc)
            metrics.REAPER_SWEEPS.labels(outcome="error").inc()
            close_old_connections()
            return None
        self.broken_sweeps = 0
        elapsed = time.monotonic() - started
        metrics.REAPER_SWEEPS.labels(outcome="ok").inc()
        metrics.REAPER_SWEEP_SECONDS.observe(elapsed)
        if result.total or ticks.todos_created:
            log_event(
                logger,
                logging.INFO,
                "reaper sweep",  # the plain line reads as before: "reaper sweep requeued=..."
                requeued=result.requeued,
                dead_lettered=result.dead_lettered,
                retries_promoted=result.retries_promoted,
                scheduled_promoted=result.scheduled_promoted,
                schedule_todos=ticks.todos_created,
                **({"expired": result.expired} if result.expired else {}),
                duration_ms=round(elapsed * 1000, 1),
            )
        return result

    def maybe_start_purge(self) -> None:
        """PURGE_DAILY: once a day one reaper (whichever claims the day first) purges, in a thread of its
        own so that sweeps go on meanwhile."""
        now = time.monotonic()
        if now < self.next_purge_check or (self.purger is not None and self.purger.is_alive()):
            return
        self.next_purge_check = now + PURGE_CHECK_SECONDS
        try:
            claimed = retention.claim_daily_purge()
        except DatabaseError as exc:
            logger.warning("purge check failed: %s", dberrors.describe(exc))
            return
        if claimed is not None:
            self.purger = threading.Thread(target=self.purge, args=(claimed,), name="purge", daemon=True)
            self.purger.start()

    def purge(self, claimed: datetime) -> None:
        started = time.monotonic()
        try:
            result = retention.run_daily_purge(claimed, should_stop=self.stopping.is_set)
        except DatabaseError as exc:
            logger.warning("daily purge failed: %s", dberrors.describe(exc))
            return
        finally:
            connection.close()  # this thread's own connection
        log_event(
            logger,
            logging.INFO,
            "purge",
            done=result.done,
            dead=result.dead,
            events=result.events,
            stopped=result.stopped,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )
