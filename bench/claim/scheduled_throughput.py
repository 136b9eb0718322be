"""What scheduling costs the queue (issue 12), on bench/harness.py.

    .venv/bin/python bench/claim/scheduled_throughput.py --beside-scheduled 1000000   # claims beside 1M future todos
    .venv/bin/python bench/claim/scheduled_throughput.py --creates 5000               # plain vs scheduled creates

--beside-scheduled N: the same claim + complete cycle through todos/queue/ (one client, mixed
priorities -3..3) in two queues of one table: "beside" holds N todos scheduled for tomorrow (priorities
-100..100, seeded once and kept across runs), "plain" holds none. That is the cost a claim pays for future
rows in its own queue (Procrastinate's trap: its fetch re-walks them); the table-wide cost of N more rows
(a deeper primary key, less cache) is in both alike. Modes alternate within each run; the median counts.
Then sql.CLAIM_NEXT alone, prepared, in each queue inside a rolled-back transaction: the statement's own
cost, steadier than cycles/s on a shared machine.

--creates N: queue.create one at a time, plain against scheduled an hour ahead, alternating blocks of N.

Runs in the scratch database switchboard_bench_scheduled (bench/harness.py), never the development one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

QUEUE = "bench"  # beside the scheduled todos
PLAIN_QUEUE = "bench.plain"  # the same workload, nothing scheduled


def seed_beside_scheduled(pending: int, scheduled: int) -> None:
    """``pending`` todos with mixed priorities in each queue, beside ``scheduled`` todos in QUEUE scheduled
    for tomorrow (re-seeded only when their count differs)."""
    (have,) = h.sb_sql("SELECT count(*) FROM todos_todo WHERE state = 'scheduled'")[0]
    if have != scheduled:
        h.reset_todos()
        h.seed_todos(
            scheduled,
            queue=QUEUE,
            state="scheduled",
            kind="'later'",
            created_at="now()",
            run_at="now() + interval '1 day' + g * interval '10 ms'",
            priority="g %% 201 - 100",
        )
    h.sb_sql("DELETE FROM todos_todo WHERE state <> 'scheduled'")
    for name in (QUEUE, PLAIN_QUEUE):
        h.seed_todos(pending, queue=name, priority="g %% 7 - 3", payload="jsonb_build_object('n', g)")
    h.analyze()


def cycles(agent: object, queue_name: str, seconds: float) -> float:
    from todos import queue

    done, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        todos = queue.claim_next(agent=agent, queues=[queue_name], limit=1)  # type: ignore[arg-type]
        for todo in todos:
            queue.complete(todo.id, agent=agent, lease_id=todo.lease_id or "", result=None)  # type: ignore[arg-type]
            done += 1
    return done / seconds


def claim_statement_rates(agent: object, seconds: float, rounds: int) -> dict[str, float]:
    from django.db import connection, transaction

    from todos import sql
    from todos.rows import server_cursor

    rates: dict[str, list[float]] = {PLAIN_QUEUE: [], QUEUE: []}
    for _ in range(rounds):
        for name in rates:
            params = {
                "scopes": agent.claim_like_patterns(),  # type: ignore[attr-defined]
                "wanted": [name],
                "agent": agent.name,  # type: ignore[attr-defined]
                "owner": agent.name,  # type: ignore[attr-defined]
                "limit": 1,
                "lease_seconds": 300.0,
                "reserve": 0,  # the fair turn alone: this loop runs no CLAIM_FAIR_READY (issue 31)
            }
            n, started = 0, time.monotonic()
            with transaction.atomic():
                with server_cursor(connection) as cursor:
                    while time.monotonic() - started < seconds:
                        cursor.execute(sql.CLAIM_NEXT, params)
                        cursor.fetchall()
                        n += 1
                transaction.set_rollback(True)
            rates[name].append(n / seconds)
    return {name: h.median(r) for name, r in rates.items()}


def beside_scheduled(scheduled: int, pending: int, seconds: float, runs: int) -> None:
    from todos.models import Agent

    agent = Agent(name="bench", claim_scopes=[QUEUE, PLAIN_QUEUE], create_scopes=[QUEUE])  # unsaved
    print(f"beside {scheduled:,} todos scheduled for tomorrow; {pending:,} pending per queue; one client")
    rates: dict[str, list[float]] = {"plain": [], "beside": []}
    for run in range(runs):
        for mode in ("plain", "beside") if run % 2 == 0 else ("beside", "plain"):
            seed_beside_scheduled(pending, scheduled)
            rates[mode].append(cycles(agent, PLAIN_QUEUE if mode == "plain" else QUEUE, seconds))
    plain, beside = h.median(rates["plain"]), h.median(rates["beside"])
    print("| plain cycles/s | beside scheduled cycles/s | beside / plain |")
    print("| ---: | ---: | ---: |")
    print(f"| {plain:,.0f} | {beside:,.0f} | {beside / plain:.2f} |")
    seed_beside_scheduled(pending, scheduled)
    alone = claim_statement_rates(agent, 3.0, 3)
    p, b = alone[PLAIN_QUEUE], alone[QUEUE]
    print(f"claim statement alone, median of 3: plain {p:,.0f}/s, beside {b:,.0f}/s ({b / p:.2f})")


def creates(n: int, runs: int) -> None:
    from todos import queue
    from todos.models import Agent

    agent = Agent(name="bench", claim_scopes=[QUEUE], create_scopes=[QUEUE])
    ratios = []
    for run in range(runs):
        h.reset_todos()
        rates = {}
        for mode in ("plain", "scheduled") if run % 2 == 0 else ("scheduled", "plain"):
            delay = 3600.0 if mode == "scheduled" else None
            started = time.monotonic()
            for i in range(n):
                queue.create(
                    queue=QUEUE,
                    title=f"create {i}",
                    payload={"n": i},
                    agent=agent,
                    delay_seconds=delay,
                    priority=i % 7 - 3,
                )
            rates[mode] = n / (time.monotonic() - started)
        ratios.append(rates["scheduled"] / rates["plain"])
        print(f"  run {run + 1}: plain {rates['plain']:,.0f}/s, scheduled {rates['scheduled']:,.0f}/s", flush=True)
    print(f"scheduled / plain create rate, median of {runs}: {h.median(ratios):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beside-scheduled", type=int, default=0, metavar="N", help="todos scheduled for tomorrow")
    parser.add_argument("--creates", type=int, default=0, metavar="N", help="time N plain and N scheduled creates")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per run and mode (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode; the median counts")
    parser.add_argument("--pending", type=int, default=50_000, help="pending todos per queue and run")
    args = parser.parse_args(argv)
    if not (args.beside_scheduled or args.creates):
        parser.error("give --beside-scheduled N and/or --creates N")
    h.scratch_django("scheduled", fresh=False)
    if args.beside_scheduled:
        beside_scheduled(args.beside_scheduled, args.pending, args.seconds, args.runs)
    if args.creates:
        creates(args.creates, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
