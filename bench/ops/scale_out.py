"""Scale-out proof: web "machines" and two reapers on one PostgreSQL (optionally behind one PgBouncer in
transaction mode), each machine holding idle long-polls, while clients drain todos through every machine
over the HTTP API. Every todo must end done exactly once, with no 5xx.

    .venv/bin/python bench/ops/scale_out.py [--todos 5000] [--clients 8] [--abandon-every 50]
        [--web-machines 2] [--pgbouncer] [--pool-size 20] [--longpolls 2000]

Issue 32's proof (two web machines' worth of processes behind PgBouncer, each holding 2,000 long-polls):

    .venv/bin/python bench/ops/scale_out.py --web-machines 2 --pgbouncer --longpolls 2000

What runs:
  * a scratch database (switchboard_bench_scale_out, bench/harness.py) on the embedded server or the
    server of DATABASE_URL, dropped and migrated afresh;
  * an agent from `manage.py create_agent scale-out --queues '*' --create-queues '*'` (token: last line);
  * --web-machines gunicorn masters as the Procfile starts them (gunicorn.conf.py: uvicorn workers), each
    on its own port (a loopback stand-in for a machine), 2 workers x 4 threads each; and two
    `manage.py reap_leases`;
  * with --pgbouncer, one PgBouncer (Debian's, todos/tests/pgbouncer_support.py) in transaction mode with
    --pool-size server connections, in front of PostgreSQL as docs/deploy.md recommends: the web
    processes' DATABASE_URL goes through it (prepared statements and server-side cursors off, PgBouncer
    1.18), their long-poll listeners' LISTEN_DATABASE_URL straight to PostgreSQL; the reapers connect
    directly;
  * with --longpolls N, one process per machine holding N connections that long-poll an empty queue
    (wait_seconds 20, again as soon as answered: bench/http/longpoll_capacity.py's hold_waiters), all
    connected before the drain starts and held open through it;
  * --todos todos created with POST /api/v1/todos/ over four queues, alternating the ports;
  * --clients threads, each bound to one port (spread evenly), looping POST /api/v1/todos/claim/
    {"limit": 10, "lease_seconds": 5} and POST /api/v1/todos/<id>/complete/ {"lease_id"}. Every
    --abandon-every'th todo is abandoned the first time it is claimed (a worker "crashes"): its
    lease lapses after 5 s and a reaper or another claim hands it out again.
Printed: the drain rate, p50/p99 of the drain's claims, and, sampled each second of the drain, the most
PostgreSQL connections to the database (pg_stat_activity, by application_name: web-N for the web
processes' statements, switchboard-listener for their LISTEN connections, reaper-N, and "(unnamed)" for
this script's own) and PgBouncer's client and server connections (SHOW POOLS).
Checks (exit status 1 if any fails): every todo is done; each got exactly one 200 from complete;
no response was a 5xx; the abandoned todos were re-delivered (attempt 2, a "lease expired" error); the
long-polls all connected, none was answered with anything but 200, and all were still held when the
drain ended.
The last line printed is a JSON summary (tests/test_scale_out.py reads it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h
from bench.http.longpoll_capacity import hold_waiters

QUEUES = ["scale.a", "scale.b", "scale.c", "scale.d"]
LEASE_SECONDS = 5


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.completed: collections.Counter[str] = collections.Counter()
        self.abandoned: set[str] = set()
        self.server_errors: list[str] = []
        self.claim_seconds: list[float] = []

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
            started = time.perf_counter()
            status, body = api.post("/api/v1/todos/claim/", {"limit": 10, "lease_seconds": LEASE_SECONDS})
            elapsed = time.perf_counter() - started
            tally.record("claim", status, body)
            with tally.lock:
                tally.claim_seconds.append(elapsed)
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


def with_application_name(url: str, name: str) -> str:
    """``url`` with ?application_name=name: its connections are named in pg_stat_activity (through PgBouncer
    too, which sets the name on the server connection it lends)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "application_name"] + [("application_name", name)]
    return urlunsplit(parts._replace(query=urlencode(query)))


@contextlib.contextmanager
def pgbouncer(pool_size: int) -> Iterator[Any]:
    """One PgBouncer in transaction mode before the server Django is set up on (the tests' own starter)."""
    from todos.tests.pgbouncer_support import PgBouncer

    directory = Path(tempfile.mkdtemp(prefix="switchboard-bench-pgbouncer-"))
    bouncer = PgBouncer(directory, pool_size=pool_size)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(directory, ignore_errors=True)


def web_env(database_url: str, bouncer: Any, machine: int) -> dict[str, str]:
    """A machine's web processes' database settings: direct, or through PgBouncer as docs/deploy.md says."""
    name = f"web-{machine}"
    listen = with_application_name(database_url, f"{name}-listen")
    if bouncer is None:
        return {"DATABASE_URL": with_application_name(database_url, name), "LISTEN_DATABASE_URL": listen}
    return {
        "DATABASE_URL": with_application_name(bouncer.url(h.scratch_db("scale_out")), name),
        "LISTEN_DATABASE_URL": listen,
        "DATABASE_PREPARED_STATEMENTS": "false",  # Debian's PgBouncer 1.18 keeps none
        "DATABASE_DISABLE_SERVER_SIDE_CURSORS": "true",
    }


class Sampler(threading.Thread):
    """Each second: the database's client connections by application_name, and PgBouncer's pools; keeps
    the most seen of each."""

    def __init__(self, database_url: str, bouncer: Any) -> None:
        super().__init__(daemon=True)
        self.database_url = with_application_name(database_url, "bench-sampler")
        self.bouncer = bouncer
        self.halt = threading.Event()
        self.most_total = 0
        self.most_web = 0  # the web processes' statement connections (not their listeners), at one time
        self.most_by_app: dict[str, int] = {}
        self.most_pool: dict[str, int] = {}
        self.error: str | None = None

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                while True:
                    self.sample(conn)
                    if self.halt.wait(1.0):
                        return
        except Exception as exc:  # reported in the summary, not fatal to the drain
            self.error = repr(exc)

    def sample(self, conn: Any) -> None:
        rows = conn.execute(
            "SELECT coalesce(nullif(application_name, ''), '(unnamed)'), count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
            "GROUP BY 1"
        ).fetchall()
        self.most_total = max(self.most_total, sum(n for _, n in rows))
        self.most_web = max(self.most_web, sum(n for app, n in rows if app.startswith("web-")))
        for app, n in rows:
            self.most_by_app[app] = max(self.most_by_app.get(app, 0), n)
        if self.bouncer is not None:
            pools = [p for p in self.bouncer.show("POOLS") if p["database"] == h.scratch_db("scale_out")]
            now = {
                "clients": sum(int(str(p["cl_active"])) + int(str(p["cl_waiting"])) for p in pools),
                "clients_waiting": sum(int(str(p["cl_waiting"])) for p in pools),
                "servers": sum(
                    int(str(p[k])) for p in pools for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
                ),
                "servers_active": sum(int(str(p["sv_active"])) for p in pools),
            }
            for key, n in now.items():
                self.most_pool[key] = max(self.most_pool.get(key, 0), n)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


class LongPolls:
    """--longpolls idle long-polls per machine, one holding process each (hold_waiters)."""

    def __init__(self, bases: list[str], token: str, per_machine: int) -> None:
        self.per_machine = per_machine
        holders = bases if per_machine else []  # none: nothing to start, hold or stop
        self.ready = [mp.Value("i", 0) for _ in holders]
        self.answered = [mp.Value("i", 0) for _ in holders]
        self.failed = mp.Value("i", 0)  # long-polls answered with anything but 200
        self.halt = mp.Event()
        self.procs = [
            mp.Process(
                target=hold_waiters,
                args=(base, token, per_machine, ready, answered, self.halt, self.failed),
                daemon=True,
            )
            for base, ready, answered in zip(holders, self.ready, self.answered, strict=True)
        ]

    def start(self, timeout: float = 180) -> None:
        for proc in self.procs:
            proc.start()
        deadline = time.monotonic() + timeout
        while sum(r.value for r in self.ready) < self.per_machine * len(self.procs):
            if time.monotonic() > deadline or not all(p.is_alive() for p in self.procs):
                raise RuntimeError(f"only {[r.value for r in self.ready]} long-polls connected")
            time.sleep(0.1)
        time.sleep(2)  # each has sent its claim and is waiting

    def held(self) -> int:
        """Long-polls whose holder is still running (each re-polls as soon as answered)."""
        return sum(r.value for r, p in zip(self.ready, self.procs, strict=True) if p.is_alive())

    def stop(self) -> None:
        self.halt.set()
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--abandon-every", type=int, default=50, help="0: abandon none")
    parser.add_argument("--timeout", type=float, default=600, help="Seconds allowed for the drain.")
    parser.add_argument("--web-machines", type=int, default=2, help="gunicorn masters, one port each")
    parser.add_argument("--pgbouncer", action="store_true", help="the web processes through one PgBouncer")
    parser.add_argument("--pool-size", type=int, default=20, help="PgBouncer's server connections (per database)")
    parser.add_argument("--longpolls", type=int, default=0, help="idle long-polls held per machine during the drain")
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
            bouncer = stack.enter_context(pgbouncer(args.pool_size)) if args.pgbouncer else None
            bases = [
                stack.enter_context(
                    h.gunicorn(
                        database_url,
                        workers=2,
                        threads=4,
                        log_name=f"scale-out-web-{m}",
                        env=web_env(database_url, bouncer, m),
                    )
                )
                for m in range(args.web_machines)
            ]
            for i in range(2):
                reaper_url = with_application_name(database_url, f"reaper-{i}")
                stack.enter_context(h.reaper(reaper_url, interval=0.5, log_name=f"scale-out-reaper-{i}"))
            summary = measure(bases, token, args, tally, failures, database_url, bouncer)
    except RuntimeError as exc:  # a web process or reaper that did not stop cleanly
        failures.append(str(exc))
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            server.drop_database(h.scratch_db("scale_out"))
    summary["failures"] = failures
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")
    print(
        f"created {summary.get('todos')} todos at {summary.get('create_per_s')}/s; drained in "
        f"{summary.get('drain_s')} s ({summary.get('drain_per_s')}/s) by {args.clients} clients over "
        f"{args.web_machines} web machines (2 workers each{', through PgBouncer' if args.pgbouncer else ''}) "
        f"with 2 reapers; claims p50 {summary.get('claim_p50_ms')} ms, p99 {summary.get('claim_p99_ms')} ms; "
        f"abandoned {summary.get('abandoned')}, re-delivered {summary.get('redelivered')}"
    )
    print(
        f"long-polls held: {summary.get('longpolls_held')} of {args.longpolls * args.web_machines}; "
        f"PostgreSQL connections (most at once): {summary.get('pg_connections_max')}, of them the web "
        f"processes' statements {summary.get('pg_connections_web_max')} (most of each name: "
        f"{summary.get('pg_connections_by_app')})"
        + (f"; PgBouncer (most at once): {summary.get('pgbouncer')}" if args.pgbouncer else "")
    )
    print("FAILED:\n  " + "\n  ".join(failures) if failures else "OK: every todo done exactly once, no 5xx")
    print(json.dumps(summary))
    return 1 if failures else 0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    bases: list[str],
    token: str,
    args: argparse.Namespace,
    tally: Tally,
    failures: list[str],
    database_url: str,
    bouncer: Any,
) -> dict[str, Any]:
    """Create the todos, hold the long-polls, drain the todos through every machine while sampling the
    connections, and check the outcome in the database."""
    from django.db import connection

    started = time.monotonic()
    ids = create_todos(bases, token, args.todos, tally)
    created_s = time.monotonic() - started
    if len(ids) != args.todos:
        failures.append(f"created {len(ids)} of {args.todos} todos: {dict(tally.statuses)}")
    polls = LongPolls(bases, token, args.longpolls)
    sampler = Sampler(database_url, bouncer)
    try:
        polls.start()
        sampler.start()
        started = time.monotonic()
        drain(bases, token, len(ids), args.clients, args.abandon_every, tally, started + args.timeout)
        drained_s = time.monotonic() - started
        held = polls.held()
    finally:
        sampler.stop()
        polls.stop()
    if polls.failed.value:
        failures.append(f"{polls.failed.value} long-polls were answered with something other than 200")
    if held != args.longpolls * len(bases):
        failures.append(f"{held} of {args.longpolls * len(bases)} long-polls still held when the drain ended")
    if sampler.error:
        failures.append(f"the connection sampler failed: {sampler.error}")
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
        "web_machines": len(bases),
        "pgbouncer": sampler.most_pool if bouncer is not None else None,
        "pool_size": args.pool_size if bouncer is not None else None,
        "longpolls_per_machine": args.longpolls,
        "longpolls_held": held,
        "longpolls_answered": sum(a.value for a in polls.answered),
        "longpolls_not_200": polls.failed.value,
        "claim_p50_ms": round(_percentile(tally.claim_seconds, 0.50) * 1000, 1),
        "claim_p99_ms": round(_percentile(tally.claim_seconds, 0.99) * 1000, 1),
        "pg_connections_max": sampler.most_total,
        "pg_connections_by_app": dict(sorted(sampler.most_by_app.items())),
        "pg_connections_web_max": sampler.most_web,
        "statuses": dict(tally.statuses),
        "unexpected_statuses": unexpected,
    }


if __name__ == "__main__":
    sys.exit(main())
