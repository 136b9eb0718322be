"""Verified webhook deliveries per second through gunicorn, with p50/p99 latency.

Each delivery is a GitHub ``pull_request`` event with a fresh X-GitHub-Delivery, signed with the
source's secret, POSTed to /ingest/<slug>/ over keep-alive HTTP; two routes match it, so each accepted
delivery is one event and two todos committed before the 202. Client processes (not threads, so the
client's GIL is not what is measured) run for --seconds at each concurrency in --clients.

    .venv/bin/python bench/ingest_throughput.py                     # clients 1,4,8,16; 10 s each
    .venv/bin/python bench/ingest_throughput.py --clients 1,8 --seconds 5

The server is the project's gunicorn.conf.py (gthread; GUNICORN_WORKERS/GUNICORN_THREADS apply) on
127.0.0.1 at a free port, against a dedicated database: the embedded PostgreSQL's database
``switchboard_bench_ingest`` (emptied first), or --database-url. Never point it at real data.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLUG = "bench-gh"
SECRET = "bench-ingest-secret"  # noqa: S105 (a throwaway source in the bench database)
BENCH_DB = "switchboard_bench_ingest"


def server_env(database_url: str | None) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
        "DEBUG": "false",
        "SECRET_KEY": "bench-only-secret-key-0123456789abcdef-not-for-production",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "false",
        "LOG_LEVEL": "WARNING",  # one INFO line per delivery would be a benchmark of the terminal
    }
    if database_url:
        env["DATABASE_URL"] = database_url
    else:
        env.pop("DATABASE_URL", None)
        env["EMBEDDED_PG_DATABASE"] = BENCH_DB
    return env


def prepare_database(env: dict[str, str]) -> None:
    """Migrate the bench database, empty it, and configure one GitHub source with two matching routes."""
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from ingest.models import Route, Source

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos_todo, events_event, ingest_route, ingest_source RESTART IDENTITY CASCADE")
    source = Source.objects.create(slug=SLUG, provider="github", secret=SECRET)
    Route.objects.create(
        source=source,
        event_pattern="pull_request.*",
        queue="bench.reviews",
        kind="review",
        title_template="{repository.full_name}#{pull_request.number}: {pull_request.title}",
    )
    Route.objects.create(source=source, event_pattern="pull_request.opened", queue="bench.triage", kind="triage")
    connection.close()


def counts() -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM events_event), (SELECT count(*) FROM todos_todo)")
        events, todos = cursor.fetchone()
    connection.close()
    return events, todos


def pull_request_body(target_bytes: int) -> bytes:
    """A pull_request.opened payload shaped like GitHub's, padded to about ``target_bytes``."""
    payload = {
        "action": "opened",
        "number": 1347,
        "pull_request": {
            "url": "https://api.github.com/repos/octocat/Hello-World/pulls/1347",
            "id": 1,
            "number": 1347,
            "state": "open",
            "title": "Amazing new feature",
            "user": {"login": "octocat", "id": 1, "type": "User"},
            "body": "Please pull these awesome changes in!",
            "head": {"ref": "new-topic", "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e"},
            "base": {"ref": "main", "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e"},
            "labels": [{"name": "enhancement"}],
        },
        "repository": {"id": 1296269, "full_name": "octocat/Hello-World", "private": False},
        "sender": {"login": "octocat", "id": 1},
    }
    body = json.dumps(payload).encode()
    if len(body) < target_bytes:
        payload["pull_request"]["body"] += " " + "x" * (target_bytes - len(body) - 1)
        body = json.dumps(payload).encode()
    return body


def connect(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.connect()
    # http.client sends a body over 2,920 bytes in a second write; with Nagle on, that write waits for
    # the server's delayed ACK of the headers (tens of ms). Providers' senders do not have that stall.
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def client(port: int, body: bytes, start_at: float, stop_at: float, results: mp.Queue) -> None:
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    conn = connect(port)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < stop_at:
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": signature,
            "User-Agent": "GitHub-Hookshot/bench",
        }
        began = time.perf_counter()
        try:
            conn.request("POST", f"/ingest/{SLUG}/", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = connect(port)
            status = 0
        latencies.append(time.perf_counter() - began)
        statuses[status] = statuses.get(status, 0) + 1
    conn.close()
    results.put((latencies, statuses))


def run_level(port: int, body: bytes, clients: int, seconds: float) -> dict[str, object]:
    results: mp.Queue = mp.Queue()
    start_at = time.time() + 0.5
    stop_at = start_at + seconds
    procs = [mp.Process(target=client, args=(port, body, start_at, stop_at, results)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    for _ in procs:
        got_latencies, got_statuses = results.get()
        latencies.extend(got_latencies)
        for status, n in got_statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    for proc in procs:
        proc.join()
    latencies.sort()
    accepted = statuses.get(202, 0)
    return {
        "clients": clients,
        "requests": len(latencies),
        "accepted": accepted,
        "statuses": statuses,
        "per_second": accepted / seconds,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan"),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", f"/ingest/{SLUG}/")
            conn.getresponse().read()  # 405: up and routing
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("gunicorn did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,4,8,16", help="comma-separated client concurrencies")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per concurrency")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level")
    parser.add_argument("--payload-bytes", type=int, default=8000, help="approximate body size")
    parser.add_argument("--database-url", default=None, help="a dedicated bench database (default: embedded)")
    args = parser.parse_args()

    env = server_env(args.database_url)
    prepare_database(env)
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "switchboard.asgi:application",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
    )
    body = pull_request_body(args.payload_bytes)
    workers, threads = env.get("GUNICORN_WORKERS", "2"), env.get("GUNICORN_THREADS", "8")
    try:
        wait_until_up(port)
        print(f"gunicorn {workers} workers x {threads} threads on 127.0.0.1:{port}; body {len(body)} bytes; 2 routes")
        print(f"{'clients':>7} {'deliveries/s':>13} {'p50 ms':>8} {'p99 ms':>8} {'requests':>9}  statuses")
        accepted_total = 0
        for clients in [int(c) for c in args.clients.split(",")]:
            if args.warmup > 0:
                accepted_total += run_level(port, body, clients, args.warmup)["accepted"]  # type: ignore[operator]
            row = run_level(port, body, clients, args.seconds)
            accepted_total += row["accepted"]  # type: ignore[operator]
            print(
                f"{row['clients']:>7} {row['per_second']:>13.0f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} "
                f"{row['requests']:>9}  {row['statuses']}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
    events, todos = counts()
    print(f"check: {accepted_total} accepted, {events} events, {todos} todos (expect 2 per event)")
    if events != accepted_total or todos != 2 * events:
        raise SystemExit("MISMATCH: an accepted delivery is missing its event or todos")


if __name__ == "__main__":
    main()
