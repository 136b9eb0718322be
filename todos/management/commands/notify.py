"""The notify sidecar (issue 29): sends the deliveries of the system queue ``_switchboard.notify`` (email,
signed webhooks, todos' callbacks; todos/notices.py enqueues them, todos/outbound.py sends them).

It claims with the queue's own ``claim_next`` under an internal agent whose only scope is that queue, sends,
and completes the delivery, or fails it with the error, so the queue's backoff, retries and dead-letters
apply (a dead-lettered delivery is in the admin like any todo). Any number may run at once: claims never
share a todo. SIGTERM or SIGINT lets the delivery in hand finish, then exits.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections

from switchboard import dberrors
from switchboard.logs import log_event
from todos import queue
from todos.errors import QueueError
from todos.event_feed import enqueue_webhooks
from todos.limits import NOTIFY_LEASE_SECONDS
from todos.models import Agent, Todo
from todos.notices import NOTIFY_QUEUE
from todos.outbound import DeliveryFailed, deliver

logger = logging.getLogger("switchboard.notify")

# Deliveries one claim takes (each is sent in turn, within its lease).
BATCH = 10


def notify_agent() -> Agent:
    """The sidecar's identity: never saved, never holding a token; its one scope is the system queue."""
    return Agent(name="switchboard-notify", claim_scopes=[NOTIFY_QUEUE], create_scopes=[])


def send_one(agent: Agent, todo: Todo) -> str:
    """Send one claimed delivery and complete or fail it; returns "sent" or "failed"."""
    assert todo.lease_id is not None
    try:
        result = deliver(todo.id, todo.payload if isinstance(todo.payload, dict) else {})
    except DeliveryFailed as exc:
        queue.fail(todo.id, agent=agent, lease_id=todo.lease_id, error=str(exc))
        logger.warning("delivery %s failed (attempt %s/%s): %s", todo.id, todo.attempt, todo.max_attempts, exc)
        return "failed"
    queue.complete(todo.id, agent=agent, lease_id=todo.lease_id, result=result)
    return "sent"


def drain(agent: Agent, *, should_stop: Any = lambda: False) -> dict[str, int]:
    """Claim and send until the queue has nothing claimable (or should_stop()). A delivery tried once in
    this drain is not tried again in it: a retry whose jittered backoff came out near zero is given back
    (release) for the next drain, so a drain always ends."""
    counts = {"sent": 0, "failed": 0}
    tried: set[str] = set()
    while not should_stop():
        todos = queue.claim_next(agent=agent, queues=[NOTIFY_QUEUE], limit=BATCH, lease_seconds=NOTIFY_LEASE_SECONDS)
        if not todos:
            break
        again = False
        for todo in todos:
            try:
                if todo.id in tried:
                    assert todo.lease_id is not None
                    queue.release(todo.id, agent=agent, lease_id=todo.lease_id)
                    again = True
                    continue
                tried.add(todo.id)
                counts[send_one(agent, todo)] += 1
            except QueueError as exc:  # the lease lapsed meanwhile: another sidecar has it now
                logger.warning("delivery %s: %s", todo.id, exc)
        if again:
            break
    return counts


class Command(BaseCommand):
    help = "Send the outbound notices (email, webhooks, callbacks) of the system queue _switchboard.notify."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=1.0, help="Seconds between polls when idle.")
        parser.add_argument("--once", action="store_true", help="Send what is claimable now and exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        agent = notify_agent()
        if options["once"]:
            enqueue_webhooks()
            counts = drain(agent)
            self.stdout.write(f"sent={counts['sent']} failed={counts['failed']}")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        logger.info("notify started interval=%ss", options["interval"])
        while not self.stopping.is_set():
            close_old_connections()
            try:
                enqueue_webhooks()  # MCP Events' webhook subscriptions: their new events become deliveries
                counts = drain(agent, should_stop=self.stopping.is_set)
            except DatabaseError as exc:
                dberrors.log_failure(logger, "notify", exc)
                close_old_connections()
            else:
                if counts["sent"] or counts["failed"]:
                    log_event(logger, logging.INFO, "notify drain", sent=counts["sent"], failed=counts["failed"])
            self.stopping.wait(options["interval"])
        logger.info("notify stopped")

    def _stop(self, signum: int, frame: Any) -> None:
        self.stopping.set()
