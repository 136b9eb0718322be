"""``manage.py work``: the in-process worker (todos/worker.py), handlers run in this Django process and
claim and complete through the queue service directly, with no HTTP in between.

    manage.py work --agent billing --queue invoices --concurrency 8 --handler billing.tasks:send_invoice

The agent's claim scopes bound what it may take, as they bound its token over HTTP. SIGTERM or SIGINT:
stop claiming, let running handlers finish within --grace, release what was claimed ahead; a second
signal skips the grace. Exits 1 if the queues are refused (outside the agent's claim scopes).
"""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from todos.models import Agent
from todos.worker import Worker, load_handler


class Command(BaseCommand):
    help = "Run a handler (module:function) for the todos of the given queues, in this process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", required=True, help="The agent whose claim scopes the worker claims with.")
        parser.add_argument("--handler", required=True, help="module:function taking a todo, returning its result.")
        parser.add_argument("--queue", action="append", dest="queues", help="Name or glob; repeat for more.")
        parser.add_argument("--concurrency", type=int, default=1, help="Handlers at once (threads).")
        parser.add_argument("--prefetch", type=int, help="Claimed ahead (default: concurrency, at least 10).")
        parser.add_argument("--lease", type=float, default=60.0, dest="lease_seconds", help="Lease seconds per claim.")
        parser.add_argument("--poll", type=float, default=1.0, dest="poll_seconds", help="Longest idle pause.")
        parser.add_argument("--grace", type=float, default=30.0, dest="grace_seconds", help="Seconds after SIGTERM.")
        parser.add_argument("--name", help="Worker label (owner <agent>/<name>).")
        parser.add_argument("--drain", action="store_true", help="Exit once the queues are empty.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            agent = Agent.objects.get(name=options["agent"], is_active=True)
        except Agent.DoesNotExist:
            raise CommandError(f"no active agent {options['agent']!r}") from None
        try:
            handler = load_handler(options["handler"])
            worker = Worker(
                agent,
                handler,
                queues=options["queues"],
                concurrency=options["concurrency"],
                prefetch=options["prefetch"],
                lease_seconds=options["lease_seconds"],
                poll_seconds=options["poll_seconds"],
                grace_seconds=options["grace_seconds"],
                name=options["name"],
                drain=options["drain"],
            )
        except (ImportError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        stats = worker.run()
        if worker.error is not None:
            raise CommandError(f"claim refused: {worker.error}")
        self.stderr.write(f"stopped: {stats}")
