"""Issue 20: todos created per second over HTTP with POST /api/v1/todos/batch/, beside one create a request.

    .venv/bin/python bench/batch_create.py                          # batches of 1,000, 1 and 2 clients, 10 s
    .venv/bin/python bench/batch_create.py --clients 1 --seconds 5  # a quick look
    .venv/bin/python bench/batch_create.py --before main --clients 1 --seconds 5 --runs 3
                                                                    # against another commit, in one run

The server is gunicorn with the project's gunicorn.conf.py (as `make run` serves it) on a free port, on the
scratch database switchboard_bench_batch_create (bench/harness.py), never the development one. Each client
is a thread with one keep-alive connection, posting batches of --batch todos (a payload of a few fields,
an idempotency key each, so the unique index is at work) until the time is up; every answer is checked
(200, one outcome per item). Then one create a request, and queue.create_many in-process, for comparison.
Target: at least 10,000 todos/s with batches of 1,000 (issue 20; PgQueuer's batch enqueue ran at 16,415
jobs/s in-process here).

--before COMMIT serves that commit's tree too (extracted by git archive into bench/out/, same database and
schema: the commit must have today's migrations), and runs the batch rows in --runs rounds, each round the
before server then today's, so a busy minute on a shared machine lands on one run of each. Each figure is
then the median of the rounds, with the load average at the start of each run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import statistics
import subprocess
import sys
import tarfile
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


def tree(commit: str) -> Path:
    """``commit``'s tree under bench/out/ (extracted once, by git archive)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=h.ROOT, capture_output=True, text=True, check=True
    )
    dest = h.out_dir() / f"tree-{sha.stdout.strip()}"
    if not (dest / "manage.py").exists():
        blob = subprocess.run(["git", "archive", commit], cwd=h.ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2", help="comma-separated client counts")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--before", help="a commit to compare with (its tree served beside today's)")
    parser.add_argument("--runs", type=int, default=1, help="rounds of the batch rows (with --before)")
    args = parser.parse_args()
    _, url = h.scratch_django("batch_create")
    from todos.models import Agent

    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    roots = {"today": h.ROOT}
    if args.before:
        roots = {f"before ({args.before})": tree(args.before), **roots}
    with contextlib.ExitStack() as stack:
        bases = {
            name: stack.enter_context(h.gunicorn(url, root=root, log_name="gunicorn-batch"))
            for name, root in roots.items()
        }
        for base in bases.values():
            measure(base, token, 1, args.batch, 1.0)  # warm: connections, prepared statements
        figures: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.runs):
            for clients in [int(c) for c in args.clients.split(",")]:
                for name, base in bases.items():
                    h.reset_todos()
                    started = load()
                    rate = measure(base, token, clients, args.batch, args.seconds)
                    figures.setdefault((name, clients), []).append(rate)
                    print(
                        f"{name:>24}: batches of {args.batch}, {clients} client(s): {rate:8.0f} todos/s ({started})",
                        flush=True,
                    )
        if args.runs > 1:
            for (name, clients), rates in figures.items():
                print(f"median of {args.runs}, {name}, {clients} client(s): {statistics.median(rates):8.0f} todos/s")
        h.reset_todos()
        started = load()
        single = measure(bases["today"], token, 1, 1, min(args.seconds, 5))
        print(f"one create a request, 1 client:   {single:8.0f} todos/s ({started})", flush=True)
    h.reset_todos()
    started = load()
    print(f"in-process create_many, 1 thread: {in_process(args.batch, min(args.seconds, 5)):8.0f} todos/s ({started})")


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
