"""Issue 31: what flow control costs the claim, in one run: a plain queue's claim before and after (within
noise is the bar) and a claim of todos naming two named limits.

    .venv/bin/python bench/claim/flow_costs.py                                   # 1 and 4 workers, 5 s, 3 runs
    .venv/bin/python bench/claim/flow_costs.py --levels 1 --runs 1 --duration 1  # a smoke run

Each worker process loops claim (limit 1) then complete, as server-side prepared statements through psycopg 3,
running what queue.claim_next runs (CLAIM_NEXT, then CLAIM_NEXT_FAIR when it answers its row of NULLs). Modes,
alternated within every run so that all see the same machine load, each on a freshly seeded table:

  before      CLAIM_NEXT and COMPLETE as they were at --before (main before issue 31, read from git)
  plain       today's, on the same plain todos (no limits, no deadline)
  two_limits  today's, every todo naming two limits, each with a max_claimed and a rate that never bind
  expiring    today's, every todo with a start-by deadline an hour ahead

Todos go to the scratch database switchboard_bench_flow (bench/harness.py), never the development one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import psycopg

from bench import harness as h

QUEUE = "bench"
MODES = ("before", "plain", "two_limits", "expiring")
BEFORE = "3da141a"  # main when issue 31 began


def prepare(mode: str, rows: int) -> None:
    from todos import flow

    h.reset_todos()
    for name in ("openai", "github"):
        flow.put(name, max_claimed=1_000_000, rate_per_second=1_000_000, rate_burst=1_000_000)
    columns: dict[str, dict[str, str]] = {
        "two_limits": {"limits": "ARRAY['github', 'openai']"},
        "expiring": {"expires_at": "now() + interval '1 hour'"},
    }
    h.seed_todos(rows, queue=QUEUE, **columns.get(mode, {}))  # type: ignore[arg-type]
    h.analyze()


def run(conn: psycopg.Connection[Any], statements: tuple[str, str, str], until: float) -> tuple[int, int]:
    claim, complete, fair = statements
    params = {
        "scopes": ["%"],
        "wanted": [QUEUE],
        "agent": "bench",
        "owner": "bench/w",
        "limit": 1,
        "lease_seconds": 300.0,
        "reserve": 0,  # the fair turn alone: this loop runs no CLAIM_FAIR_READY (issue 31)
    }
    from todos import sql

    lease_at = [c.strip() for c in sql.TODO_COLUMNS.split(",")].index("lease_id")  # the same place then
    done = empty = 0
    while time.monotonic() < until:
        rows = conn.execute(claim, params, prepare=True).fetchall()
        if rows and rows[0][0] is None:
            rows = conn.execute(fair, params, prepare=True).fetchall()
        if not rows:
            empty += 1
            continue
        conn.execute(
            complete,
            {"id": rows[0][0], "lease_id": rows[0][lease_at], "agent": "bench", "visible": ["%"], "result": None},
            prepare=True,
        ).fetchall()
        done += 1
    return done, empty


def worker(url: str, commands: Any, results: Any, barrier: Any) -> None:
    h.setup_django(url)
    from bench.claim.claim_cost import statements_at
    from todos import sql

    today = (sql.CLAIM_NEXT, sql.COMPLETE, sql.CLAIM_NEXT_FAIR)
    statements = {"before": statements_at(BEFORE), **dict.fromkeys(MODES[1:], today)}
    conn = psycopg.connect(url, autocommit=True)
    while (command := commands.get()) is not None:
        mode, duration = command
        barrier.wait()
        results.put(run(conn, statements[mode], time.monotonic() + duration))
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    _, url = h.scratch_django("flow")
    rows = int(max(20_000, 6_000 * args.duration))
    table = []
    for level in (int(x) for x in args.levels.split(",")):
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(level + 1)
        results = ctx.Queue()
        commands = [ctx.Queue() for _ in range(level)]
        procs = [ctx.Process(target=worker, args=(url, c, results, barrier), daemon=True) for c in commands]
        for p in procs:
            p.start()
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        try:
            for i in range(args.runs):
                for mode in MODES[i % len(MODES) :] + MODES[: i % len(MODES)]:  # rotate who goes first
                    prepare(mode, rows)
                    for c in commands:
                        c.put((mode, args.duration))
                    barrier.wait(timeout=120)
                    outcomes = [results.get(timeout=args.duration + 120) for _ in range(level)]
                    done = sum(d for d, _ in outcomes)
                    if any(e for _, e in outcomes):
                        print(f"  warning: {mode} ran out of todos")
                    rates[mode].append(done / args.duration)
                    print(f"  level {level} run {i + 1} {mode:10}: {done / args.duration:7.0f} jobs/s", flush=True)
        finally:
            for c in commands:
                c.put(None)
            for p in procs:
                p.join(timeout=30)
        table.append((level, {m: statistics.median(r) for m, r in rates.items()}))
    print()
    print("| workers | before jobs/s | plain | vs before | two limits | vs plain | expiring | vs plain |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for level, m in table:
        before, plain, two, exp = m["before"], m["plain"], m["two_limits"], m["expiring"]
        print(
            f"| {level} | {before:,.0f} | {plain:,.0f} | {plain / before - 1:+.1%} "
            f"| {two:,.0f} | {two / plain - 1:+.0%} | {exp:,.0f} | {exp / plain - 1:+.0%} |"
        )


if __name__ == "__main__":
    main()
