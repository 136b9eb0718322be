"""The Python client's worker runtime over HTTP, draining no-op todos at concurrency 1 / 4 / 16, beside
today's HTTP path (one claim and one complete per todo, N loops), in one run.

    .venv/bin/python bench/http/worker_throughput.py [--todos 2000] [--runs 3] [--concurrency 1,4,16]

The server is the shipped one (gunicorn + uvicorn workers, gunicorn.conf.py, 2 processes) on a scratch
database; the figure is todos drained per second from the first claim to the last completion sent.
The in-process workers of PgQueuer 1.6 and Oban for Python 0.7 are not run here: Oban 0.7 needs Python
3.12, and PgQueuer 1.6's psycopg-driver worker stalled in its first dequeue on this machine (see
docs/benchmarks.md for the reference figures)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))

from switchboard_client import AsyncClient, Worker

from bench import harness as h

QUEUE = "bench.worker"


def make_token() -> str:
    from todos.models import Agent

    Agent.objects.filter(name="bench").delete()
    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    return token


def seed(n: int) -> None:
    from django.db import connection

    h.reset_todos()
    h.seed_todos(n, queue=QUEUE)
    h.analyze()
    connection.close()


async def runtime(base: str, token: str, concurrency: int) -> tuple[float, int]:
    worker = Worker(
        AsyncClient(base, token), queues=[QUEUE], concurrency=concurrency, lease_seconds=60, poll_seconds=0, drain=True
    )

    @worker.handler("*")
    async def noop(todo: object) -> None:
        return None

    started = time.perf_counter()
    stats = await worker.arun()
    assert isinstance(worker.client, AsyncClient)
    await worker.client.aclose()
    return time.perf_counter() - started, stats.completed


async def one_by_one(base: str, token: str, concurrency: int) -> tuple[float, int]:
    """Today's HTTP path: each loop claims one todo and completes it before the next claim."""
    done = 0
    async with AsyncClient(base, token) as client:

        async def loop() -> None:
            nonlocal done
            while todos := await client.claim([QUEUE], limit=1, lease_seconds=60):
                await client.complete(todos[0], result=None)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return time.perf_counter() - started, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16")
    args = parser.parse_args()
    server, url = h.scratch_django("worker_throughput")
    token = make_token()
    print(h.machine_summary(server))
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    with h.gunicorn(url) as base:
        for c in levels:
            figures: dict[str, list[float]] = {"runtime": [], "one_by_one": []}
            for _ in range(args.runs):
                seed(args.todos)
                took, done = asyncio.run(runtime(base, token, c))
                assert done == args.todos, (done, args.todos)
                figures["runtime"].append(done / took)
                seed(args.todos)
                took, done = asyncio.run(one_by_one(base, token, c))
                figures["one_by_one"].append(done / took)
            medians = {k: statistics.median(v) if v else float("nan") for k, v in figures.items()}
            rows.append((c, medians))
            print(
                f"concurrency {c}: runtime {medians['runtime']:,.0f}/s, one-by-one {medians['one_by_one']:,.0f}/s "
                f"(runs: {figures})",
                flush=True,
            )
    print()
    print("| concurrency | worker runtime (HTTP) | one claim + one complete per todo (HTTP) | ratio |")
    print("| --- | --- | --- | --- |")
    for c, m in rows:
        print(f"| {c} | {m['runtime']:,.0f} | {m['one_by_one']:,.0f} | {m['runtime'] / m['one_by_one']:.1f}x |")


if __name__ == "__main__":
    main()
