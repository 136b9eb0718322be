#!/usr/bin/env python3
"""A Switchboard worker in a few lines, on the Python client's worker runtime (clients/python).

    pip install ./clients/python
    SWITCHBOARD_URL=http://127.0.0.1:8000 SWITCHBOARD_TOKEN=sb_... \\
        python examples/worker.py --queues demo --handler sleep:2

The runtime claims in batches up to its free slots, heartbeats every third of the lease, and sends
completions in batches; a handler's exception fails the todo. SIGTERM or SIGINT stops claiming, gives
running handlers --grace seconds (0 here: at once), then releases what is left (pending again, its attempt
given back). SIGKILL leaves the leases to lapse; the todos come back when they do.

Handlers: ``sleep:N`` (sleep N seconds, return {"slept": N}), ``crash`` (raise), ``echo`` (return the
payload), or ``module:function`` taking the todo and returning a JSON value. The same, without this
script: ``switchboard worker module`` (a module defining a Worker or a dict of kind -> handler).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from switchboard_client import Client, Todo, Worker


def builtin_handler(spec: str) -> Callable[[Todo], Any]:
    if spec.startswith("sleep:"):
        seconds = float(spec.split(":", 1)[1])

        def sleep(todo: Todo) -> Any:
            time.sleep(seconds)
            return {"slept": seconds}

        return sleep
    if spec == "crash":

        def crash(todo: Todo) -> Any:
            raise RuntimeError(f"demo crash on {todo.id}")

        return crash
    if spec == "echo":
        return lambda todo: todo.payload
    module, _, name = spec.partition(":")
    handler: Callable[[Todo], Any] = getattr(importlib.import_module(module), name or "handle")
    return handler


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="or SWITCHBOARD_URL")
    parser.add_argument("--token", default=env("SWITCHBOARD_TOKEN"), help="or SWITCHBOARD_TOKEN")
    parser.add_argument("--queues", default=env("SWITCHBOARD_QUEUES", ""), help="comma-separated names or globs")
    parser.add_argument("--handler", default=env("SWITCHBOARD_HANDLER", "sleep:1"))
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lease", type=float, default=float(env("SWITCHBOARD_LEASE", "30")), help="seconds")
    parser.add_argument("--wait", type=float, default=20.0, help="long-poll seconds when idle (0-20)")
    parser.add_argument("--grace", type=float, default=0.0, help="seconds for running handlers after SIGTERM")
    parser.add_argument("--name", default=env("SWITCHBOARD_WORKER", f"pid{os.getpid()}"), help="worker label")
    parser.add_argument("--drain", action="store_true", help="exit once a claim comes back empty")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a token is needed: --token or SWITCHBOARD_TOKEN")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    worker = Worker(
        Client(args.url, args.token),
        queues=[q.strip() for q in args.queues.split(",") if q.strip()] or None,
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        poll_seconds=args.wait,
        grace_seconds=args.grace,
        name=args.name,
        drain=args.drain,
    )
    worker.add_handler("*", builtin_handler(args.handler))
    worker.run()
    return 1 if worker.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
