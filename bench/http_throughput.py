#!/usr/bin/env python3
"""Claim+complete cycles per second over HTTP (gunicorn, the project's gunicorn.conf.py) beside the
in-process todos/queue.py rate, at 1, 4 and 16 concurrent clients; then long-poll wake latency
(create -> claimed response) over N wakes.

    .venv/bin/python bench/http_throughput.py [--seconds 5] [--clients 1,4,16] [--wakes 200]

Runs against a dedicated database: the embedded server's `switchboard_bench_http` (or BENCH_DATABASE_URL),
which it migrates and empties. Every client is its own process with one keep-alive connection, and
each cycle is two requests: POST /todos/claim/ (limit 1), then POST /todos/<id>/complete/.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENV = {
    "DJANGO_SETTINGS_MODULE": "switchboard.settings",
    "SECRET_KEY": "bench-only-secret-key-0123456789abcdefghijklmnopqrstuvwxyz",
    "DEBUG": "false",
    "ALLOWED_HOSTS": "127.0.0.1",
    "SECURE_SSL_REDIRECT": "false",
    "LOG_LEVEL": "WARNING",
}
if os.environ.get("BENCH_DATABASE_URL"):
    ENV["DATABASE_URL"] = os.environ["BENCH_DATABASE_URL"]
else:
    ENV["EMBEDDED_PG_DATABASE"] = "switchboard_bench_http"
    os.environ.pop("DATABASE_URL", None)
os.environ.update(ENV)

QUEUE = "bench.http"


def setup_django() -> None:
    import django

    django.setup()


def preload(n: int, queue_name: str = QUEUE) -> None:
    """n pending todos in one statement (bench set-up, not a transition: nothing is running yet)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos_todo")
        cursor.execute(
            "INSERT INTO todos_queue (name, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", [queue_name]
        )
        cursor.execute(
            """INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,
                   errors, created_at, updated_at)
               SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), %s, '', 'bench', 'bench', '{}'::jsonb,
                   'pending', 0, 5, '[]'::jsonb, now() + make_interval(secs => g / 1e6), now()
               FROM generate_series(1, %s) g""",
            [queue_name, n],
        )
        cursor.execute("VACUUM ANALYZE todos_todo")


def done_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos_todo WHERE state = 'done'")
        return cursor.fetchone()[0]


# --- in-process: queue.claim_next + queue.complete ------------------------------------------------------


def _inprocess_client(agent_name: str, start: float, stop: float, out: mp.Queue) -> None:
    from django.db import connection

    from todos import queue
    from todos.models import Agent

    agent = Agent.objects.get(name=agent_name)
    while time.time() < start:
        time.sleep(0.001)
    cycles = 0
    while time.time() < stop:
        todos = queue.claim_next(agent=agent, limit=1, lease_seconds=60)
        if not todos:
            break
        queue.complete(todos[0].id, agent=agent, lease_id=todos[0].lease_id)
        cycles += 1
    connection.close()
    out.put(cycles)


# --- over HTTP -----------------------------------------------------------------------------------------


class NoDelayConnection(http.client.HTTPConnection):
    """http.client sends a request's headers and body in two writes; without TCP_NODELAY the second
    waits for the server's delayed ACK (tens of ms a request on a keep-alive connection). requests and
    httpx clients (urllib3, httpcore) set it too."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Http:
    def __init__(self, port: int, token: str, timeout: float = 30) -> None:
        self.conn = NoDelayConnection("127.0.0.1", port, timeout=timeout)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        self.conn.request("POST", "/api/v1" + path, json.dumps(body), self.headers)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())


def _http_client(port: int, token: str, batch: int, start: float, stop: float, out: mp.Queue) -> None:
    """batch 1: claim one, complete it (two requests a todo). batch N: claim N, one batch complete."""
    client = Http(port, token)
    while time.time() < start:
        time.sleep(0.001)
    cycles = errors = 0
    while time.time() < stop:
        status, body = client.post("/todos/claim/", {"limit": batch, "lease_seconds": 60})
        if status != 200 or not body["todos"]:
            errors += status != 200
            break
        todos = body["todos"]
        if batch == 1:
            status, _ = client.post(f"/todos/{todos[0]['id']}/complete/", {"lease_id": todos[0]["lease_id"]})
            ok = 1 if status == 200 else 0
        else:
            items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in todos]
            status, body = client.post("/todos/complete/", {"items": items})
            ok = sum(o["status"] == 200 for o in body["outcomes"]) if status == 200 else 0
        cycles += ok
        errors += len(todos) - ok
    out.put((cycles, errors))


def run_clients(target, args_for, n: int, seconds: float) -> list:
    out: mp.Queue = mp.Queue()
    start = time.time() + 0.5
    procs = [mp.Process(target=target, args=(*args_for(), start, start + seconds, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(port: int) -> subprocess.Popen:
    env = {**os.environ, "GUNICORN_BIND": f"127.0.0.1:{port}"}
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "switchboard.asgi:application", "-c", str(ROOT / "gunicorn.conf.py")],
        cwd=ROOT,
        env=env,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/api/v1/queues/")
            if conn.getresponse().status in (200, 401):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("gunicorn did not start")


def wake_latencies(port: int, token: str, wakes: int) -> list[float]:
    """Sequential wakes: a long-poll waits on an empty queue, the bench creates one todo (through
    queue.create, which NOTIFYs) and times until the claimed response arrives."""
    from todos import queue

    client = Http(port, token)
    latencies: list[float] = []
    for i in range(wakes):
        got: dict = {}

        def poll(got: dict = got) -> None:
            _, body = client.post("/todos/claim/", {"queues": ["bench.wake"], "wait_seconds": 10})
            got["t"] = time.perf_counter()
            got["todos"] = body["todos"]

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.03)  # let the request reach its wait
        created_at = time.perf_counter()
        todo, _ = queue.create(queue="bench.wake", title=f"wake {i}")
        t.join(15)
        if [x["id"] for x in got.get("todos", [])] != [todo.id]:
            raise RuntimeError(f"wake {i}: expected {todo.id}, got {got}")
        latencies.append(got["t"] - created_at)
    return latencies


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--wakes", type=int, default=200)
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    setup_django()
    from django.core.management import call_command
    from django.db import connection

    from todos.models import Agent

    call_command("migrate", verbosity=0)
    Agent.objects.filter(name="bench").delete()
    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    budget = 4000  # todos per client-second, more than either path can take
    connection.close()

    rows = []
    port = free_port()
    server = start_gunicorn(port)
    try:
        for n in levels:
            preload(int(budget * args.seconds * max(1, min(n, 4))))
            connection.close()
            inproc = sum(run_clients(_inprocess_client, lambda: ("bench",), n, args.seconds)) / args.seconds
            row = [n, inproc]
            for batch in (1, 10):
                preload(int(budget * args.seconds * max(1, min(n, 4)) / 2))
                connection.close()
                results = run_clients(_http_client, lambda batch=batch: (port, token, batch), n, args.seconds)
                row.append(sum(c for c, _ in results) / args.seconds)
                row.append(sum(e for _, e in results))
            rows.append(row)
            print(f"{n:>2} clients: in-process {row[1]:6.0f}/s  HTTP {row[2]:6.0f}/s  HTTP batched {row[4]:6.0f}/s")
        preload(0)
        latencies = wake_latencies(port, token, args.wakes)
    finally:
        server.terminate()
        server.wait(30)
    p50, p99 = pct(latencies, 50) * 1000, pct(latencies, 99) * 1000
    worst, mean = max(latencies) * 1000, statistics.mean(latencies) * 1000
    print(f"wake latency, {len(latencies)} wakes: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f}, mean {mean:.1f}")
    print()
    print(
        "| clients | in-process queue.py | HTTP, claim + complete | ratio | HTTP, claim 10 + batch complete | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for n, inproc, single, _, batched, _ in rows:
        print(
            f"| {n} | {inproc:,.0f} | {single:,.0f} | {single / inproc:.2f} | {batched:,.0f} | {batched / inproc:.2f} |"
        )
    print(f"errors (todos not completed): {sum(r[3] + r[5] for r in rows)}")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "http_throughput.json").write_text(
        json.dumps({"rows": rows, "wake_ms": {"p50": p50, "p99": p99, "n": len(latencies)}}, indent=2)
    )


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
