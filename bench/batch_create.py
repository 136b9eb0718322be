"""Issue 20: todos created per second over HTTP with POST /api/v1/todos/batch/, beside one create a request.

    .venv/bin/python bench/batch_create.py                          # batches of 1,000, 1 and 2 clients, 10 s
    .venv/bin/python bench/batch_create.py --clients 1 --seconds 5  # a quick look

The server is gunicorn with the project's gunicorn.conf.py (as `make run` serves it) on a free port, on the
scratch database switchboard_bench_batch_create (bench/harness.py), never the development one. Each client
is a thread with one keep-alive connection, posting batches of --batch todos (a payload of a few fields,
an idempotency key each, so the unique index is at work) until the time is up; every answer is checked
(200, one outcome per item). Then one create a request, and queue.create_many in-process, for comparison.
Target: at least 10,000 todos/s with batches of 1,000 (issue 20; PgQueuer's batch enqueue ran at 16,415
jobs/s in-process here).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as h

QUEUE = "bench.batch"
_serial = itertools.count()


def item(n: int) -> dict[str, object]:
    return {
        "queue": QUEUE,
        "kind": "noop",
        "title": f"item {n}",
        "payload": {"n": n, "repo": "acme/widgets", "pr": n % 997},
        "idempotency_key": f"k{n}",
    }


def client(base: str, token: str, batch: int, until: float, made: list[int]) -> None:
    api = h.Api(base, token)
    while time.monotonic() < until:
        todos = [item(next(_serial)) for _ in range(batch)]
        if batch == 1:
            status, body = api.post("/api/v1/todos/", todos[0])
            assert status == 201, (status, body)
        else:
            status, body = api.post("/api/v1/todos/batch/", {"todos": todos})
            assert status == 200 and len(body["outcomes"]) == batch, (status, str(body)[:300])
        made.append(batch)
    api.close()


def measure(base: str, token: str, clients: int, batch: int, seconds: float) -> float:
    made: list[int] = []
    until = time.monotonic() + seconds
    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(base, token, batch, until, made)) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(made) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2", help="comma-separated client counts")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    _, url = h.scratch_django("batch_create")
    from todos.models import Agent

    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    with h.gunicorn(url) as base:
        measure(base, token, 1, args.batch, 1.0)  # warm: connections, prepared statements
        for clients in [int(c) for c in args.clients.split(",")]:
            h.reset_todos()
            rate = measure(base, token, clients, args.batch, args.seconds)
            print(f"batches of {args.batch}, {clients} client(s): {rate:8.0f} todos/s", flush=True)
        h.reset_todos()
        single = measure(base, token, 1, 1, min(args.seconds, 5))
        print(f"one create a request, 1 client:   {single:8.0f} todos/s", flush=True)
    h.reset_todos()
    print(f"in-process create_many, 1 thread: {in_process(args.batch, min(args.seconds, 5)):8.0f} todos/s")


def in_process(batch: int, seconds: float) -> float:
    """queue.create_many itself, no HTTP and no validation: what the statements cost."""
    from todos import queue

    made = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        made += len(queue.create_many([item(next(_serial)) for _ in range(batch)]))
    return made / (time.monotonic() - start)


if __name__ == "__main__":
    main()
