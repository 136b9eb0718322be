"""Scale-out proof: two web processes and two reapers on one PostgreSQL, clients draining todos
through both web processes over the HTTP API. Every todo must end done exactly once, with no 5xx.

    .venv/bin/python bench/scale_out.py [--todos 5000] [--clients 8] [--abandon-every 50]

What runs:
  * a dedicated database (switchboard_scale_out) on the embedded server, dropped and migrated afresh
    (or DATABASE_URL, which must then be a scratch database: its todos and events are truncated);
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
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DB_NAME = "switchboard_scale_out"
QUEUES = ["scale.a", "scale.b", "scale.c", "scale.d"]
LEASE_SECONDS = 5

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
os.environ.setdefault("SECRET_KEY", "scale-out-bench-only-" + "x" * 40)
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
os.environ.setdefault("SECURE_SSL_REDIRECT", "false")
os.environ.setdefault("EMBEDDED_PG_DATABASE", DB_NAME)
os.environ.setdefault("LOG_LEVEL", "WARNING")


def prepare_database() -> tuple[str, bool]:
    """A fresh, migrated database: the DATABASE_URL the child processes use, and whether the database
    is the dedicated one (dropped afterwards) rather than a given scratch one."""
    import django

    scratch_url = os.environ.get("DATABASE_URL")
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if scratch_url:
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE todos_todo, events_event, todos_agent CASCADE")
        return scratch_url, False
    import psycopg

    s = connection.settings_dict
    connection.close()
    with psycopg.connect(host=s["HOST"], user=s["USER"], dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{s["NAME"]}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{s["NAME"]}"')
    call_command("migrate", verbosity=0)
    return f"postgres://{s['USER']}@/{s['NAME']}?host={s['HOST']}", True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    """One keep-alive connection to one web process; reconnects once if the server closed it."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        data = json.dumps(body)
        for attempt in range(2):
            try:
                self.conn.request("POST", path, body=data, headers=self.headers)
                response = self.conn.getresponse()
                raw = response.read()
                return response.status, (json.loads(raw) if raw else None)
            except (ConnectionError, http.client.HTTPException):
                # A keep-alive connection the server closed. Repeating the request is safe here: a
                # repeated complete answers 409 (never a second 200), a repeated claim at worst strands
                # a lease that lapses and is handed out again.
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt:
                    raise
        raise AssertionError("unreachable")


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


def create_todos(ports: list[int], token: str, n: int, tally: Tally, threads: int = 8) -> list[str]:
    ids: list[str] = []
    lock = threading.Lock()

    def work(worker: int) -> None:
        api = {port: Api(port, token) for port in ports}
        for i in range(worker, n, threads):
            port = ports[i % len(ports)]
            status, body = api[port].post(
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
    ports: list[int], token: str, expected: int, clients: int, abandon_every: int, tally: Tally, deadline: float
) -> None:
    def work(worker: int) -> None:
        api = Api(ports[worker % len(ports)], token)
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


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"web process on port {port} never became ready")
        time.sleep(0.3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--abandon-every", type=int, default=50, help="0: abandon none")
    parser.add_argument("--timeout", type=float, default=600, help="Seconds allowed for the drain.")
    parser.add_argument("--keep-db", action="store_true", help="Keep the dedicated database afterwards.")
    args = parser.parse_args()

    database_url, dedicated = prepare_database()
    env = {**os.environ, "DATABASE_URL": database_url}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each gunicorn master makes its own (gunicorn.conf.py)
    python = sys.executable
    made = subprocess.run(
        [python, "manage.py", "create_agent", "scale-out", "--queues", "*", "--create-queues", "*"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if made.returncode != 0:
        print(made.stdout, made.stderr, file=sys.stderr)
        return 1
    token = made.stdout.strip().splitlines()[-1].strip()

    ports = [free_port(), free_port()]
    children: list[subprocess.Popen[bytes]] = []
    logs = []
    for port in ports:
        log = open(ROOT / f".scale-out-web-{port}.log", "wb")
        logs.append(log)
        children.append(
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "gunicorn",
                    "switchboard.asgi:application",
                    "-c",
                    "gunicorn.conf.py",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    "2",
                    "--threads",
                    "4",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    for i in range(2):
        log = open(ROOT / f".scale-out-reaper-{i}.log", "wb")
        logs.append(log)
        children.append(
            subprocess.Popen(
                [python, "manage.py", "reap_leases", "--interval", "0.5"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    tally = Tally()
    failures: list[str] = []
    summary: dict[str, Any] = {}
    try:
        for port in ports:
            wait_ready(port)
        started = time.monotonic()
        ids = create_todos(ports, token, args.todos, tally)
        created_s = time.monotonic() - started
        if len(ids) != args.todos:
            failures.append(f"created {len(ids)} of {args.todos} todos: {dict(tally.statuses)}")
        started = time.monotonic()
        drain(ports, token, len(ids), args.clients, args.abandon_every, tally, started + args.timeout)
        drained_s = time.monotonic() - started

        from django.db import connection

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
        summary = {
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
            "failures": failures,
        }
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                failures.append(f"pid {child.pid} ignored SIGTERM for 30 s")
        for log in logs:
            log.close()
        if dedicated and not args.keep_db:
            _drop_database()
    exits = [child.returncode for child in children]
    if any(code != 0 for code in exits):
        failures.append(f"exit codes of web, web, reaper, reaper: {exits}")
    summary["failures"] = failures
    if not failures:
        for path in ROOT.glob(".scale-out-*.log"):
            path.unlink()
    print(
        f"created {summary.get('todos')} todos at {summary.get('create_per_s')}/s; drained in "
        f"{summary.get('drain_s')} s ({summary.get('drain_per_s')}/s) by {args.clients} clients over 2 web "
        f"processes with 2 reapers; abandoned {summary.get('abandoned')}, re-delivered "
        f"{summary.get('redelivered')}"
    )
    print("FAILED:\n  " + "\n  ".join(failures) if failures else "OK: every todo done exactly once, no 5xx")
    print(json.dumps(summary))
    return 1 if failures else 0


def _drop_database() -> None:
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    connection.close()
    with psycopg.connect(host=s["HOST"], user=s["USER"], dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
