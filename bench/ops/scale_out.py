"""Scale-out proof: two web processes and two reapers on one PostgreSQL, clients draining todos
through both web processes over the HTTP API. Every todo must end done exactly once, with no 5xx.

    .venv/bin/python bench/ops/scale_out.py [--todos 5000] [--clients 8] [--abandon-every 50]

What runs:
  * a scratch database (switchboard_bench_scale_out, bench/harness.py) on the embedded server or the
    server of DATABASE_URL, dropped and migrated afresh;
  * an agent from `manage.py create_agent scale-out --queues '*' --create-queues '*'` (token: last line);
  * two gunicorn masters on two ports (2 workers x 4 threads each) and two `manage.py reap_leases`;
  * --todos todos created with POST /api/v1/todos/ over four queues, alternating the two ports;
  * --clients threads, each bound to one port (half per port), looping POST /api/v1/todos/claim/
    {"limit": 10, "lease_seconds": 5} and POST /api/v1/todos/<id>/complete/ {"lease_id"}. Every
    --abandon-every'th todo is abandoned the first time it is claimed (a worker "crashes"): its
    lease lapses after 5 s and a reaper or another claim hands it out again.
Checks (exit status 1 if any fails): every todo is done; each got exactly one 200 from complete;
no response was a 5xx; the abandoned todos were re-delivered (attempt 2, a "lease expired" error).
The last line printed is a JSON summary (tests/test_scale_out.py reads it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

QUEUES = ["scale.a", "scale.b", "scale.c", "scale.d"]
LEASE_SECONDS = 5


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.completed: collections.Counter[str] = collections.Counter()
        self.abandoned: set[str] = set()
        self.server_errors: list[str] = []

    def record(self, what: str, status: int, detail: Any = None) -> None:
        with self.lock:
            self.statuses[f"{what} {status}"] += 1
            if status >= 500:
                self.server_errors.append(f"{what} {status} {str(detail)[:200]}")


def create_todos(bases: list[str], token: str, n: int, tally: Tally, threads: int = 8) -> list[str]:
    ids: list[str] = []
    lock = threading.Lock()

    def work(worker: int) -> None:
        api = {base: h.Api(base, token, timeout=60) for base in bases}
        for i in range(worker, n, threads):
            base = bases[i % len(bases)]
            status, body = api[base].post(
                "/api/v1/todos/",
                {"queue": QUEUES[i % len(QUEUES)], "title": f"todo {i}", "idempotency_key": f"scale-{i}"},
            )
            tally.record("create", status, body)
            if status == 201:
                with lock:
                    ids.append(body["id"])

    run_threads(work, threads)
    return ids


def drain(
    bases: list[str], token: str, expected: int, clients: int, abandon_every: int, tally: Tally, deadline: float
) -> None:
    def work(worker: int) -> None:
        # A repeated request (h.Api reconnects once) is safe here: a repeated complete answers 409, never
        # a second 200; a repeated claim at worst strands a lease that lapses and is handed out again.
        api = h.Api(bases[worker % len(bases)], token, timeout=60)
        while time.monotonic() < deadline:
            with tally.lock:
                if len(tally.completed) >= expected:
                    return
            status, body = api.post("/api/v1/todos/claim/", {"limit": 10, "lease_seconds": LEASE_SECONDS})
            tally.record("claim", status, body)
            todos = body.get("todos", []) if status == 200 and isinstance(body, dict) else []
            if not todos:
                time.sleep(0.2)  # nothing claimable now: abandoned leases come back after they lapse
                continue
            for todo in todos:
                if abandon_every and int(todo["id"][-6:], 16) % abandon_every == 0:
                    with tally.lock:
                        first_time = todo["id"] not in tally.abandoned
                        tally.abandoned.add(todo["id"])
                    if first_time:
                        continue  # "crash": never complete this claim
                status, body = api.post(f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]})
                tally.record("complete", status, body)
                if status == 200:
                    with tally.lock:
                        tally.completed[todo["id"]] += 1

    run_threads(work, clients)


def run_threads(target: Any, n: int) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--abandon-every", type=int, default=50, help="0: abandon none")
    parser.add_argument("--timeout", type=float, default=600, help="Seconds allowed for the drain.")
    parser.add_argument("--keep-db", action="store_true", help="Keep the dedicated database afterwards.")
    args = parser.parse_args()

    server, database_url = h.scratch_django("scale_out")
    made = subprocess.run(
        [h.PYTHON, "manage.py", "create_agent", "scale-out", "--queues", "*", "--create-queues", "*"],
        cwd=h.ROOT,
        env=h.project_env(database_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if made.returncode != 0:
        print(made.stdout, made.stderr, file=sys.stderr)
        return 1
    token = made.stdout.strip().splitlines()[-1].strip()

    tally = Tally()
    failures: list[str] = []
    summary: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as stack:
            bases = [
                stack.enter_context(h.gunicorn(database_url, workers=2, threads=4, log_name="scale-out-web"))
                for _ in range(2)
            ]
            for i in range(2):
                stack.enter_context(h.reaper(database_url, interval=0.5, log_name=f"scale-out-reaper-{i}"))
            summary = measure(bases, token, args, tally, failures)
    except RuntimeError as exc:  # a web process or reaper that did not stop cleanly
        failures.append(str(exc))
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            server.drop_database(h.scratch_db("scale_out"))
    summary["failures"] = failures
    print(
        f"created {summary.get('todos')} todos at {summary.get('create_per_s')}/s; drained in "
        f"{summary.get('drain_s')} s ({summary.get('drain_per_s')}/s) by {args.clients} clients over 2 web "
        f"processes with 2 reapers; abandoned {summary.get('abandoned')}, re-delivered "
        f"{summary.get('redelivered')}"
    )
    print("FAILED:\n  " + "\n  ".join(failures) if failures else "OK: every todo done exactly once, no 5xx")
    print(json.dumps(summary))
    return 1 if failures else 0


def measure(
    bases: list[str], token: str, args: argparse.Namespace, tally: Tally, failures: list[str]
) -> dict[str, Any]:
    """Create the todos, drain them through both web processes, and check the outcome in the database."""
    from django.db import connection

    started = time.monotonic()
    ids = create_todos(bases, token, args.todos, tally)
    created_s = time.monotonic() - started
    if len(ids) != args.todos:
        failures.append(f"created {len(ids)} of {args.todos} todos: {dict(tally.statuses)}")
    started = time.monotonic()
    drain(bases, token, len(ids), args.clients, args.abandon_every, tally, started + args.timeout)
    drained_s = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, count(*) FROM todos_todo GROUP BY state")
        states = dict(cursor.fetchall())
        cursor.execute(
            "SELECT count(*) FROM todos_todo WHERE id = ANY(%s) AND attempt >= 2 "
            'AND errors @> \'[{"error": "lease expired"}]\'',
            [sorted(tally.abandoned)],
        )
        redelivered = cursor.fetchone()[0]
    twice = [i for i, n in tally.completed.items() if n != 1]
    missing = set(ids) - set(tally.completed)
    if states != {"done": len(ids)}:
        failures.append(f"states in the database: {states}")
    if twice:
        failures.append(f"{len(twice)} todos completed with 200 more than once, e.g. {twice[:3]}")
    if missing:
        failures.append(f"{len(missing)} todos never completed, e.g. {sorted(missing)[:3]}")
    if tally.server_errors:
        failures.append(f"{len(tally.server_errors)} 5xx responses, e.g. {tally.server_errors[:3]}")
    if redelivered != len(tally.abandoned):
        failures.append(f"{len(tally.abandoned)} abandoned but {redelivered} re-delivered after a lapse")
    unexpected = {k: v for k, v in tally.statuses.items() if k not in ("create 201", "claim 200", "complete 200")}
    return {
        "todos": len(ids),
        "done": states.get("done", 0),
        "clients": args.clients,
        "abandoned": len(tally.abandoned),
        "redelivered": redelivered,
        "create_per_s": round(len(ids) / created_s, 1),
        "drain_s": round(drained_s, 1),
        "drain_per_s": round(len(ids) / drained_s, 1),
        "statuses": dict(tally.statuses),
        "unexpected_statuses": unexpected,
    }


if __name__ == "__main__":
    sys.exit(main())
