"""Issue 20: todos created per second over HTTP with POST /api/v1/todos/batch/, beside one create a request.

    .venv/bin/python bench/http/batch_create.py                          # batches of 1,000, 1 and 2 clients, 10 s
    .venv/bin/python bench/http/batch_create.py --clients 1 --seconds 5  # a quick look
    .venv/bin/python bench/http/batch_create.py --before main --clients 1 --seconds 5 --runs 3
                                                                    # against another commit, in one run

The server is gunicorn with the project's gunicorn.conf.py (as `make run` serves it) on a free port, on the
scratch database switchboard_bench_batch_create (bench/harness.py), never the development one. Each client
is a thread with one keep-alive connection, posting batches of --batch todos (a payload of a few fields,
an idempotency key each, so the unique index is at work) until the time is up; every answer is checked
(200, one outcome per item). Then one create a request, and queue.create_many in-process, for comparison.
Target: at least 10,000 todos/s with batches of 1,000 (issue 20; PgQueuer's batch enqueue ran at 16,415
jobs/s in-process here).

--before COMMIT serves that commit's tree too (extracted by git archive into bench/out/), on its own scratch
database (switchboard_bench_batch_create_before) migrated by that tree, so each side runs its own schema and
triggers. The batch rows run in --runs rounds, each round the before server then today's, so a busy minute
on a shared machine lands on one run of each; with --runs above 1 the medians follow. Each line carries the
1-minute load average at its start: the machine is shared.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Json

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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


@dataclass
class Side:
    """One server of the comparison: its tree and its own scratch database, migrated by that tree."""

    name: str
    root: Path
    url: str

    def sql(self, statement: str, params: Any = None) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(statement, params)

    def prepare(self, agent: dict[str, Any]) -> None:
        """Migrate (another tree's database, by that tree) and add the bench agent, as today's has it."""
        if self.root != h.ROOT:
            env = h.project_env(self.url, PYTHONPATH=str(self.root))
            migrate = [h.PYTHON, "-m", "django", "migrate", "--noinput", "-v", "0"]
            subprocess.run(migrate, cwd=self.root, env=env, check=True)
            self.sql("INSERT INTO todos_agent SELECT * FROM json_populate_record(NULL::todos_agent, %s)", [Json(agent)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2", help="comma-separated client counts")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--before", help="a commit to compare with (its tree served beside today's)")
    parser.add_argument("--runs", type=int, default=1, help="rounds of the batch rows")
    args = parser.parse_args()
    server, url = h.scratch_django("batch_create")
    sides = [Side("today", h.ROOT, url)]
    if args.before:
        before_url = server.create_database(h.scratch_db("batch_create_before"))
        sides.insert(0, Side(f"before ({args.before})", tree(args.before), before_url))
    from todos.models import Agent

    bench_agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = bench_agent.set_new_token()
    bench_agent.save()
    (row,) = h.sb_sql("SELECT row_to_json(a) FROM todos_agent a WHERE name = 'bench'")
    for side in sides:
        side.prepare(row[0])
    with contextlib.ExitStack() as stack:
        bases = {
            side.name: stack.enter_context(h.gunicorn(side.url, root=side.root, log_name="gunicorn-batch"))
            for side in sides
        }
        for side in sides:
            measure(bases[side.name], token, 1, args.batch, 1.0)  # warm: connections, prepared statements
        figures: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.runs):
            for clients in [int(c) for c in args.clients.split(",")]:
                for side in sides:
                    side.sql("TRUNCATE todos_todo")
                    started = load()
                    rate = measure(bases[side.name], token, clients, args.batch, args.seconds)
                    figures.setdefault((side.name, clients), []).append(rate)
                    shape = f"batches of {args.batch}, {clients} client(s)"
                    print(f"{side.name:>24}: {shape}: {rate:8.0f} todos/s ({started})", flush=True)
        if args.runs > 1:
            for (name, clients), rates in figures.items():
                print(f"median of {args.runs}, {name}, {clients} client(s): {statistics.median(rates):8.0f} todos/s")
        today = sides[-1]
        today.sql("TRUNCATE todos_todo")
        started = load()
        single = measure(bases[today.name], token, 1, 1, min(args.seconds, 5))
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
