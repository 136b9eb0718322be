#!/usr/bin/env python3
"""What idle long-polls cost the server: request latency, wake latency, connections and memory with 0,
100, 500 and 2,000 agents long-polling an empty queue (wait_seconds 20, re-polling when answered).

    .venv/bin/python bench/http/longpoll_capacity.py [--waiters 0,100,500,2000] [--samples 200] [--wakes 50]
        [--wake-span 22]

The server is the default configuration (the project's gunicorn.conf.py: uvicorn workers,
GUNICORN_WORKERS=2) on a free port, on a scratch database (switchboard_bench_longpoll) of the embedded
server or of DATABASE_URL's server. The waiters are one separate process of asyncio connections
(bench/http/aio_http.py); the measuring client is this process, one keep-alive connection, one request at
a time. For each level it prints p50/p99 of create, claim+complete and GET /queues/, the wake latency
(create -> the claimed response reaching a waiter among the idle ones; the wakes are spread over a
whole wait, so some meet the burst of re-polls of waiters that began together), the statements per
idle poll (the database's transactions per poll answered, over one whole wait with nothing else
running), the client connections in pg_stat_activity (bounded by processes x (WEB_THREADS + 1
listener)), and each web process's RSS; then checks the targets of issues 10 and 19. A waiter that is
not woken at all (answered [] at its deadline) is counted as missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness
from bench.http.aio_http import Connection

IDLE = {"queues": ["lp.idle"], "wait_seconds": 20}
WORK = "lp.work"
WAKE = "lp.wake"


def hold_waiters(base: str, token: str, n: int, ready: Any, answered: Any, stop: Any, failed: Any = None) -> None:
    """A child process: n connections, each long-polling the empty queue again as soon as answered;
    ``failed`` (a shared counter, optional) counts the answers that were not 200."""

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.002)  # open gradually, so their 20 s deadlines are spread too
        conn = await Connection(base, token).open()
        with ready.get_lock():
            ready.value += 1
        while not stop.is_set():
            status, _ = await conn.request("POST", "/api/v1/todos/claim/", IDLE)
            with answered.get_lock():
                answered.value += 1
            if failed is not None and status != 200:
                with failed.get_lock():
                    failed.value += 1
        conn.close()

    async def main() -> None:
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _server_connections(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def _transactions(database_url: str) -> int:
    """Transactions committed in the database so far: each of the server's statements is one."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def _statements_per_poll(database_url: str, answered: Any, seconds: float) -> float:
    """With nothing but the idle long-polls running for one whole wait, the database's transactions
    per poll answered (the reads of the counters themselves excluded)."""
    polls, xacts = answered.value, _transactions(database_url)
    time.sleep(seconds)
    # Statistics reach pg_stat_database when a backend goes idle, at most once a second.
    time.sleep(1.5)
    return (_transactions(database_url) - xacts - 1) / max(1, answered.value - polls)


def _timed(samples: dict[str, list[float]], name: str, call: Any) -> Any:
    started = time.perf_counter()
    result = call()
    samples.setdefault(name, []).append(time.perf_counter() - started)
    return result


def _measure(api: harness.Api, n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for _ in range(n):
        status, _ = _timed(samples, "create", lambda: api.post("/api/v1/todos/", {"queue": WORK}))
        assert status == 201, status

        def cycle() -> None:
            status, body = api.post("/api/v1/todos/claim/", {"queues": [WORK]})
            [todo] = body["todos"]
            status, _ = api.post(f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]})
            assert status == 200, status

        _timed(samples, "claim+complete", cycle)
        status, _ = _timed(samples, "GET /queues/", lambda: api.get("/api/v1/queues/"))
        assert status == 200, status
    return samples


def _wakes(base: str, token: str, api: harness.Api, n: int, spacing: float) -> tuple[list[float], int]:
    """Wake latencies, and how many waiters were not woken at all (answered [] at their deadline)."""
    waiter = harness.Api(base, token)
    latencies = []
    missed = 0
    for _ in range(n):
        out: dict[str, Any] = {}

        def wait(out: dict[str, Any] = out) -> None:
            status, body = waiter.post("/api/v1/todos/claim/", {"queues": [WAKE], "wait_seconds": 20})
            out["at"] = time.perf_counter()
            assert status == 200, body
            out["todos"] = body["todos"]
            for todo in body["todos"]:
                waiter.post(f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]})

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(spacing)  # it is waiting by now
        created = time.perf_counter()
        assert api.post("/api/v1/todos/", {"queue": WAKE})[0] == 201
        thread.join(30)
        if out.get("todos"):
            latencies.append(out["at"] - created)
        else:  # not woken: take the todo out of the way, so the next waiter is timed on its own wake
            missed += 1
            _, body = api.post("/api/v1/todos/claim/", {"queues": [WAKE]})
            for todo in body["todos"]:
                api.post(f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]})
    waiter.close()
    return latencies, missed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiters", default="0,100,500,2000")
    parser.add_argument("--samples", type=int, default=200, help="of each request, per level")
    parser.add_argument("--wakes", type=int, default=50)
    parser.add_argument(
        "--wake-span",
        type=float,
        default=IDLE["wait_seconds"] * 1.1,
        help="seconds the wakes are spread over: a whole wait, so they meet the idle waiters' re-polls",
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.waiters.split(",")]

    server = harness.pg_server()
    database_url = server.create_database("switchboard_bench_longpoll")
    harness.migrate(database_url)
    token = harness.manage(database_url, "create_agent", "longpoll", "--queues", "lp.*").strip().splitlines()[-1]
    print(harness.machine_summary(server))
    rows = []
    with harness.gunicorn(database_url) as base:
        api = harness.Api(base, token)
        for n in levels:
            ready = mp.Value("i", 0)
            answered = mp.Value("i", 0)
            stop = mp.Event()
            holder = mp.Process(target=hold_waiters, args=(base, token, n, ready, answered, stop), daemon=True)
            holder.start()
            deadline = time.monotonic() + 120
            while ready.value < n:
                assert time.monotonic() < deadline, f"only {ready.value} of {n} waiters connected"
                time.sleep(0.1)
            time.sleep(2)  # each has sent its claim and is waiting
            samples = _measure(api, args.samples)
            wakes, missed = _wakes(base, token, api, args.wakes, max(0.15, args.wake_span / max(1, args.wakes)))
            connections = _server_connections(database_url)
            per_poll = _statements_per_poll(database_url, answered, IDLE["wait_seconds"] * 1.1) if n else None
            pids = _web_pids(base)
            rss = [_rss_mb(p) for p in pids]
            stop.set()
            holder.join(40)
            if holder.is_alive():
                holder.kill()
            row: dict[str, Any] = {
                "waiters": n,
                "connections": connections,
                "processes": len(pids),
                "rss": rss,
                "per_poll": per_poll,
                "missed": missed,
            }
            for name, values in samples.items():
                row[name] = (harness.percentile(values, 50) * 1000, harness.percentile(values, 99) * 1000)
            row["wake"] = (harness.percentile(wakes, 50) * 1000, harness.percentile(wakes, 99) * 1000)
            rows.append(row)
            print(_line(row), flush=True)
        api.close()
    _report(rows)


def _web_pids(base: str) -> list[int]:
    """The web processes serving ``base``: the holders of its listening socket but the master."""
    port = base.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False).stdout
    pids = {int(p.split("=")[1]) for p in out.replace(",", " ").replace(")", " ").split() if p.startswith("pid=")}
    return sorted(p for p in pids if _ppid(p) in pids)


def _ppid(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    return -1


def _ms(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.1f} / {pair[1]:.1f}"


def _line(row: dict[str, Any]) -> str:
    rss = ", ".join(f"{r:.0f}" for r in row["rss"])
    per_poll = "-" if row["per_poll"] is None else f"{row['per_poll']:.2f}"
    return (
        f"| {row['waiters']:,} | {_ms(row['create'])} | {_ms(row['claim+complete'])} | {_ms(row['GET /queues/'])} "
        f"| {_ms(row['wake'])} | {row['missed']} | {per_poll} | {row['connections']} | {rss} |"
    )


def _report(rows: list[dict[str, Any]]) -> None:
    print()
    print(
        "| idle long-polls | create p50 / p99 ms | claim+complete p50 / p99 ms | GET /queues/ p50 / p99 ms "
        "| wake p50 / p99 ms | wakes missed | statements per idle poll | server connections "
        "| RSS per web process, MB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(_line(row))
    base = next((r for r in rows if r["waiters"] == 0), None)
    top = max(rows, key=lambda r: r["waiters"])
    print()
    print(f"targets, at {top['waiters']:,} waiters:")
    checks = []
    for name in ("create", "claim+complete", "GET /queues/"):
        p99 = top[name][1]
        checks.append((f"{name} p99 {p99:.1f} ms < 100 ms", p99 < 100))
        if base is not None:
            checks.append((f"{name} p99 within 2x of 0 waiters ({base[name][1]:.1f} ms)", p99 <= 2 * base[name][1]))
    checks.append((f"wake p50 {top['wake'][0]:.1f} ms < 20 ms", top["wake"][0] < 20))
    checks.append((f"wake p99 {top['wake'][1]:.1f} ms < 100 ms", top["wake"][1] < 100))
    checks.append((f"every waiter woken ({top['missed']} missed)", top["missed"] == 0))
    # Each web process: at most one connection per thread of its pool, plus its listener's.
    threads = int(os.environ.get("WEB_THREADS", "8"))
    limit = top["processes"] * (threads + 1)
    checks.append(
        (
            f"server connections {top['connections']} <= processes x (pool {threads} + 1 listener) = {limit}",
            top["connections"] <= limit,
        )
    )
    for text, ok in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {text}")


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
