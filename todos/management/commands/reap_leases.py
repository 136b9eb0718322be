"""The sidecar: returns lapsed leases to the queue (or dead-letters them at their cap) and promotes
due retries. Claims do not depend on it (a claim sees lapsed leases and due retries at once); it keeps
states truthful for operators. Any number may run at once: every batch locks with SKIP LOCKED.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections

from todos import queue

logger = logging.getLogger("switchboard.reaper")


class Command(BaseCommand):
    help = "Loop the lease reaper and the retry scheduler (one sweep with --once)."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None, help="Seconds between sweeps.")
        parser.add_argument("--once", action="store_true", help="Make one sweep and exit.")
        parser.add_argument("--batch", type=int, default=None, help="Rows per batch.")

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"] if options["interval"] is not None else settings.REAPER_INTERVAL_SECONDS
        batch = options["batch"] or settings.REAPER_BATCH_SIZE
        if options["once"]:
            self.sweep(batch)
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        logger.info("reaper started interval=%ss batch=%s", interval, batch)
        while not self.stopping.is_set():
            self.sweep(batch)
            self.stopping.wait(interval)
        logger.info("reaper stopped")

    def _stop(self, signum: int, frame: Any) -> None:
        # The batch in hand finishes (it is one short statement); the loop then ends.
        self.stopping.set()

    def sweep(self, batch: int) -> queue.ReapResult | None:
        close_old_connections()
        started = time.monotonic()
        try:
            result = queue.reap_once(batch=batch, should_stop=self.stopping.is_set)
        except DatabaseError as exc:
            # The database is down or restarting: say so once per sweep and try again next time.
            logger.warning("reaper sweep failed: %s", exc.__class__.__name__)
            close_old_connections()
            return None
        if result.total:
            logger.info(
                "reaper sweep requeued=%d dead_lettered=%d retries_promoted=%d duration_ms=%.1f",
                result.requeued,
                result.dead_lettered,
                result.retries_promoted,
                (time.monotonic() - started) * 1000,
            )
        return result
