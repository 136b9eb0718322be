"""Claim + complete cycles per second through todos/queue.py, and the same cycle as raw SQL.

    .venv/bin/python bench/queue_throughput.py                            # 1, 2, 4, 8 workers; 10 s; 3 runs
    .venv/bin/python bench/queue_throughput.py --duration 3 --runs 1      # a quick look
    .venv/bin/python bench/queue_throughput.py --beside-scheduled 1000000 --levels 1,8   # issue 12
    .venv/bin/python bench/queue_throughput.py --creates 5000      # plain vs scheduled creates, one process

Each level starts that many worker processes (each sets up Django once and keeps its connections). For
every run the table is truncated and seeded with pending todos, then all workers loop for --duration
seconds: ``queue.claim_next(limit=1)`` then ``queue.complete(...)``, or, in raw mode, the very same two
statements (todos/sql.py's CLAIM_NEXT and COMPLETE, same parameters) through psycopg 3 directly, as
server-side prepared statements. Modes alternate within each run so both see the same machine load.
The median of the runs is reported, with the ratio queue/raw (the issue's target: >= 0.70).

With --beside-scheduled N the two modes are instead "plain" and "beside", both through queue.py and both
with mixed priorities (-3..3): "beside" claims from a queue that also holds N todos scheduled for
tomorrow (seeded once, kept across runs), "plain" from a queue of the same table with none. That is the
cost a claim pays for future rows in its own queue (Procrastinate's trap: its fetch re-walks them); the
table-wide cost of N more rows (a deeper primary key, less cache) is in both modes alike.

Todos go to a dedicated database (switchboard_bench on the embedded server, or DATABASE_URL if its name
contains "bench"), never the development one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _django  # sets up Django before the app imports below

_django.setup("switchboard_bench")

import psycopg  # noqa: E402
from django.db import connection  # noqa: E402

from todos import queue, sql  # noqa: E402
from todos.models import Agent  # noqa: E402

QUEUE = "bench"
PLAIN_QUEUE = "bench.plain"  # --beside-scheduled: the same workload in a queue with nothing scheduled
ID, LEASE_ID = 0, 20  # positions in sql.TODO_COLUMNS


def seed(n: int) -> None:
    with connection.cursor() as cur:
        cur.execute("TRUNCATE todos_todo")
        cur.execute("INSERT INTO todos_queue (name) VALUES (%s) ON CONFLICT DO NOTHING", [QUEUE])
        cur.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at)
            SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), %s, 'bench', 'noop', 'job ' || i,
                   jsonb_build_object('n', i), 'pending', 0, 5, '[]'::jsonb,
                   now() - interval '1 hour' + i * interval '1 ms', now(),
                   now() - interval '1 hour' + i * interval '1 ms'
            FROM generate_series(1, %s) i
            """,
            [QUEUE, n],
        )
        cur.execute("VACUUM (ANALYZE) todos_todo")


def seed_beside_scheduled(n: int, scheduled: int) -> None:
    """--beside-scheduled: n pending todos with mixed priorities in each of QUEUE and PLAIN_QUEUE, beside
    ``scheduled`` todos in QUEUE scheduled for tomorrow (seeded only when their count differs)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM todos_todo WHERE state = 'scheduled'")
        if cur.fetchone()[0] != scheduled:
            cur.execute("TRUNCATE todos_todo")
            cur.execute(
                """
                INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,
                                        errors, created_at, updated_at, run_at, priority)
                SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), %s, 'bench', 'later', 'later ' || i,
                       '{}'::jsonb, 'scheduled', 0, 5, '[]'::jsonb, now(), now(),
                       now() + interval '1 day' + i * interval '10 ms', mod(i, 201) - 100
                FROM generate_series(1, %s) i
                """,
                [QUEUE, scheduled],
            )
        cur.execute("DELETE FROM todos_todo WHERE state <> 'scheduled'")
        cur.execute("INSERT INTO todos_queue (name) VALUES (%s), (%s) ON CONFLICT DO NOTHING", [QUEUE, PLAIN_QUEUE])
        for name in (QUEUE, PLAIN_QUEUE):
            cur.execute(
                """
                INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,
                                        errors, created_at, updated_at, run_at, priority)
                SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), %s, 'bench', 'noop', 'job ' || i,
                       jsonb_build_object('n', i), 'pending', 0, 5, '[]'::jsonb,
                       now() - interval '1 hour' + i * interval '1 ms', now(),
                       now() - interval '1 hour' + i * interval '1 ms', mod(i, 7) - 3
                FROM generate_series(1, %s) i
                """,
                [name, n],
            )
        cur.execute("VACUUM (ANALYZE) todos_todo")


def bench_agent() -> Agent:
    # Unsaved: the queue functions read only its name and scopes.
    return Agent(name="bench", claim_scopes=[QUEUE, PLAIN_QUEUE], create_scopes=[QUEUE])


def run_queue(agent: Agent, until: float, queue_name: str = QUEUE) -> tuple[int, int]:
    done = empty = 0
    while time.monotonic() < until:
        todos = queue.claim_next(agent=agent, queues=[queue_name], limit=1)
        if not todos:
            empty += 1
            continue
        todo = todos[0]
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
        done += 1
    return done, empty


def run_raw(conn: psycopg.Connection[Any], agent: Agent, until: float) -> tuple[int, int]:
    claim_params = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [QUEUE],
        "agent": agent.name,
        "owner": agent.name,
        "limit": 1,
        "lease_seconds": 300.0,
    }
    visible = agent.visible_like_patterns()
    done = empty = 0
    while time.monotonic() < until:
        rows = conn.execute(sql.CLAIM_NEXT, claim_params, prepare=True).fetchall()
        if not rows:
            empty += 1
            continue
        row = rows[0]
        conn.execute(
            sql.COMPLETE,
            {"id": row[ID], "lease_id": row[LEASE_ID], "agent": agent.name, "visible": visible, "result": None},
            prepare=True,
        ).fetchall()
        done += 1
    return done, empty


def worker(commands: Any, results: Any, barrier: Any) -> None:
    agent = bench_agent()
    db = connection.settings_dict
    conn = psycopg.connect(
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        host=db["HOST"] or db.get("OPTIONS", {}).get("host"),
        port=db["PORT"] or None,
        autocommit=True,
    )
    connection.ensure_connection()
    while True:
        command = commands.get()
        if command is None:
            break
        mode, duration = command
        barrier.wait()
        cpu = time.process_time()
        until = time.monotonic() + duration
        if mode == "raw":
            done, empty = run_raw(conn, agent, until)
        else:
            done, empty = run_queue(agent, until, PLAIN_QUEUE if mode == "plain" else QUEUE)
        results.put((done, empty, time.process_time() - cpu))
    conn.close()
    connection.close()


def measure_level(
    level: int, duration: float, runs: int, seed_rows: int, scheduled: int = 0
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Jobs/s per run and client CPU microseconds per job per run, for each mode."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(level + 1)
    results = ctx.Queue()
    commands = [ctx.Queue() for _ in range(level)]
    procs = [ctx.Process(target=worker, args=(commands[i], results, barrier), daemon=True) for i in range(level)]
    for p in procs:
        p.start()
    modes = ("plain", "beside") if scheduled else ("queue", "raw")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for run in range(runs):
            # Alternate which mode goes first, so neither always runs on a freshly vacuumed table.
            for mode in modes if run % 2 == 0 else modes[::-1]:
                if scheduled:
                    seed_beside_scheduled(seed_rows, scheduled)
                else:
                    seed(seed_rows)
                for c in commands:
                    c.put((mode, duration))
                barrier.wait(timeout=120)
                outcomes = [results.get(timeout=duration + 120) for _ in range(level)]
                done = sum(d for d, _, _ in outcomes)
                empty = sum(e for _, e, _ in outcomes)
                cpu[mode].append(1e6 * sum(c for _, _, c in outcomes) / max(done, 1))
                if empty:
                    print(f"  warning: {mode} level {level} ran out of todos ({empty} empty claims); raise --seed")
                rates[mode].append(done / duration)
                print(
                    f"  level {level} run {run + 1} {mode:5}: {done / duration:8.0f} jobs/s"
                    f" {cpu[mode][-1]:6.0f} us client CPU/job",
                    flush=True,
                )
    finally:
        for c in commands:
            c.put(None)
        for p in procs:
            p.join(timeout=30)
    return rates, cpu


def claim_statement_rates(seconds: float = 3.0, rounds: int = 3) -> None:
    """--beside-scheduled: sql.CLAIM_NEXT alone, prepared, on one connection, in each queue in turn, inside
    a transaction rolled back at the end (each claim takes a fresh row): the statement's own cost, without
    the complete, the commit and other clients (steadier than jobs/s on a shared machine)."""
    agent = bench_agent()
    db = connection.settings_dict
    conn = psycopg.connect(
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        host=db["HOST"] or db.get("OPTIONS", {}).get("host"),
        port=db["PORT"] or None,
        autocommit=True,
    )
    rates: dict[str, list[float]] = {PLAIN_QUEUE: [], QUEUE: []}
    for _ in range(rounds):
        for name in rates:
            params = {
                "scopes": agent.claim_like_patterns(),
                "wanted": [name],
                "agent": agent.name,
                "owner": agent.name,
                "limit": 1,
                "lease_seconds": 300.0,
            }
            n, started = 0, time.monotonic()
            with conn.transaction(force_rollback=True):
                while time.monotonic() - started < seconds:
                    conn.execute(sql.CLAIM_NEXT, params, prepare=True).fetchall()
                    n += 1
            rates[name].append(n / seconds)
    conn.close()
    plain, beside = statistics.median(rates[PLAIN_QUEUE]), statistics.median(rates[QUEUE])
    ratio = beside / plain
    print(f"claim statement alone, median of {rounds}: plain {plain:,.0f}/s, beside {beside:,.0f}/s ({ratio:.2f})")


def measure_creates(n: int, runs: int) -> None:
    """queue.create one at a time, plain against scheduled an hour ahead, alternating blocks of n so both
    see the same load; creates/s and the ratio per run."""
    ratios = []
    for run in range(runs):
        rates = {}
        for mode in ("plain", "scheduled") if run % 2 == 0 else ("scheduled", "plain"):
            delay = 3600.0 if mode == "scheduled" else None
            started = time.monotonic()
            for i in range(n):
                queue.create(
                    queue=QUEUE, title=f"create {i}", payload={"n": i}, delay_seconds=delay, priority=i % 7 - 3
                )
            rates[mode] = n / (time.monotonic() - started)
        ratios.append(rates["scheduled"] / rates["plain"])
        print(f"  run {run + 1}: plain {rates['plain']:,.0f}/s, scheduled {rates['scheduled']:,.0f}/s", flush=True)
    print(f"scheduled / plain create rate, median of {runs}: {statistics.median(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run (default 10)")
    parser.add_argument("--levels", default="1,2,4,8", help="worker processes per level (default 1,2,4,8)")
    parser.add_argument("--runs", type=int, default=3, help="runs per level and mode; the median counts")
    parser.add_argument("--seed", type=int, default=0, help="pending todos per run (default: enough for 5k/s)")
    parser.add_argument(
        "--beside-scheduled",
        type=int,
        default=0,
        metavar="N",
        help="compare claims in a queue holding N todos scheduled for tomorrow with claims in one holding none",
    )
    parser.add_argument("--creates", type=int, default=0, metavar="N", help="time N plain and N scheduled creates")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.creates:
        _django.migrate()
        with connection.cursor() as cur:
            cur.execute("TRUNCATE todos_todo")
        measure_creates(args.creates, args.runs)
        return
    seed_rows = args.seed or int(max(20_000, 5_000 * args.duration))
    _django.migrate()
    connection.close()  # the workers are spawned, but keep nothing open across the fork-free start anyway
    print(f"duration {args.duration}s, runs {args.runs}, {seed_rows:,} pending todos per run, db switchboard_bench")
    if args.beside_scheduled:
        print(f"beside {args.beside_scheduled:,} todos scheduled for tomorrow, priorities -100..100")
        table = []
        for level in levels:
            rates, cpu = measure_level(level, args.duration, args.runs, seed_rows, args.beside_scheduled)
            p, b = statistics.median(rates["plain"]), statistics.median(rates["beside"])
            table.append((level, p, b, statistics.median(cpu["plain"]), statistics.median(cpu["beside"])))
        print()
        print("| workers | plain jobs/s | beside scheduled jobs/s | beside / plain | client CPU/job plain | beside |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for level, p, b, pc, bc in table:
            print(f"| {level} | {p:,.0f} | {b:,.0f} | {b / p:.2f} | {pc:,.0f} us | {bc:,.0f} us |")
        seed_beside_scheduled(seed_rows, args.beside_scheduled)
        claim_statement_rates()
        return
    table = []
    for level in levels:
        rates, cpu = measure_level(level, args.duration, args.runs, seed_rows)
        q, r = statistics.median(rates["queue"]), statistics.median(rates["raw"])
        table.append((level, q, r, statistics.median(cpu["queue"]), statistics.median(cpu["raw"])))
    print()
    # Client CPU per job is what queue.py itself adds; on a shared machine it is steadier than jobs/s.
    print("| workers | queue.py jobs/s | raw SQL jobs/s | queue.py / raw | client CPU/job queue.py | raw |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for level, q, r, qc, rc in table:
        print(f"| {level} | {q:,.0f} | {r:,.0f} | {q / r:.2f} | {qc:,.0f} us | {rc:,.0f} us |")


if __name__ == "__main__":
    main()
