"""Issue 11 (control): what queue controls cost the claim, before and after, in one run.

    .venv/bin/python bench/claim/control_throughput.py                       # 1 and 4 workers, 5 s, 3 runs
    .venv/bin/python bench/claim/control_throughput.py --levels 1 --runs 1   # a quick look

Each worker process loops claim (limit 1) then complete, as server-side prepared statements through
psycopg 3 (as `bench/compare/compare.py`'s psycopg rows: what the statements themselves cost). Modes, alternated
within every run so that all see the same machine load, each on a freshly seeded table:

  before     CLAIM_NEXT as it was before this issue (todos/sql.py at BASE_REV, read from git), without the
             todo_live_leases index (dropped for the run): today's claim
  unlimited  today's CLAIM_NEXT on an unlimited, unpaused queue: the 5% budget
  capped     the same queue with max_claimed = 1000 (never reached): the lock-and-count path
  rated      the same queue with a token bucket that never runs dry: the lock-and-write-back path

Todos go to the scratch database switchboard_bench_control (bench/harness.py: on the embedded server, or
on DATABASE_URL's), never the development one. The figures in
docs/benchmarks.md were taken on a shared, loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import psycopg

from bench import harness as h

QUEUE = "bench"
BASE_REV = "f2f9d28"  # the branch point: the claim before queue controls
MODES = ("before", "unlimited", "capped", "rated")
LIVE_LEASES_INDEX = (
    "CREATE INDEX IF NOT EXISTS todo_live_leases ON todos_todo (queue, lease_expires_at) WHERE state = 'claimed'"
)


def _sql_before() -> types.ModuleType:
    text = subprocess.run(
        ["git", "show", f"{BASE_REV}:todos/sql.py"], capture_output=True, text=True, check=True, cwd=h.ROOT
    ).stdout
    module = types.ModuleType("sql_before")
    exec(compile(text, "sql_before.py", "exec"), module.__dict__)  # noqa: S102 (our own file, from git)
    return module


def _column(name: str) -> int:
    """A column's position in the rows the claim hands back (sql.TODO_COLUMNS)."""
    from todos import sql

    return [c.strip() for c in sql.TODO_COLUMNS.split(",")].index(name)


def seed(n: int) -> None:
    h.reset_todos()
    h.seed_todos(n, queue=QUEUE)


def prepare(mode: str) -> None:
    from todos import controls

    h.reset_todos()  # the rows come next, after the index is set for the mode
    h.sb_sql("DROP INDEX IF EXISTS todo_live_leases" if mode == "before" else LIVE_LEASES_INDEX)
    # a fresh scratch database has no queue row until todos arrive, and set_limits needs one
    h.sb_sql("INSERT INTO todos_queue (name, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", [QUEUE])
    controls.set_limits(
        QUEUE,
        max_claimed=1000 if mode == "capped" else None,
        rate_per_second=1e6 if mode == "rated" else None,
        rate_burst=1_000_000 if mode == "rated" else None,
    )


def run(conn: psycopg.Connection[Any], claim_sql: str, until: float) -> tuple[int, int]:
    from todos import sql
    from todos.models import Agent

    # Unsaved: the statements read only its name and scopes.
    agent = Agent(name="bench", claim_scopes=[QUEUE], create_scopes=[QUEUE])
    id_at, lease_id_at = _column("id"), _column("lease_id")
    claim_params = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [QUEUE],
        "agent": agent.name,
        "owner": agent.name,
        "limit": 1,
        "lease_seconds": 300.0,
        "reserve": 0,  # the fair turn alone: this loop runs no CLAIM_FAIR_READY (issue 31)
    }
    visible = agent.visible_like_patterns()
    done = empty = 0
    while time.monotonic() < until:
        rows = conn.execute(claim_sql, claim_params, prepare=True).fetchall()
        if not rows:
            empty += 1
            continue
        conn.execute(
            sql.COMPLETE,
            {
                "id": rows[0][id_at],
                "lease_id": rows[0][lease_id_at],
                "agent": agent.name,
                "visible": visible,
                "result": None,
            },
            prepare=True,
        ).fetchall()
        done += 1
    return done, empty


def worker(url: str, commands: Any, results: Any, barrier: Any) -> None:
    h.setup_django(url)  # a spawned child: Django again, on the same scratch database
    from todos import sql

    claims = {"before": _sql_before().CLAIM_NEXT, **dict.fromkeys(MODES[1:], sql.CLAIM_NEXT)}
    conn = psycopg.connect(url, autocommit=True)
    while (command := commands.get()) is not None:
        mode, duration = command
        barrier.wait()
        results.put(run(conn, claims[mode], time.monotonic() + duration))
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    _, url = h.scratch_django("control")
    seed_rows = int(max(20_000, 5_000 * args.duration))
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
                order = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]  # rotate who goes first
                for mode in order:
                    prepare(mode)
                    seed(seed_rows)
                    for c in commands:
                        c.put((mode, args.duration))
                    barrier.wait(timeout=120)
                    outcomes = [results.get(timeout=args.duration + 120) for _ in range(level)]
                    done = sum(d for d, _ in outcomes)
                    if any(e for _, e in outcomes):
                        print(f"  warning: {mode} ran out of todos")
                    rates[mode].append(done / args.duration)
                    print(f"  level {level} run {i + 1} {mode:9}: {done / args.duration:7.0f} jobs/s", flush=True)
        finally:
            for c in commands:
                c.put(None)
            for p in procs:
                p.join(timeout=30)
            prepare("unlimited")  # leave the index and an unlimited queue behind
        table.append((level, {m: statistics.median(r) for m, r in rates.items()}))
    print()
    print("| workers | before jobs/s | unlimited | vs before | capped (max_claimed) | rated (bucket) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for level, m in table:
        b = m["before"]
        print(
            f"| {level} | {b:,.0f} | {m['unlimited']:,.0f} | {m['unlimited'] / b - 1:+.1%} "
            f"| {m['capped']:,.0f} ({m['capped'] / b - 1:+.0%}) | {m['rated']:,.0f} ({m['rated'] / b - 1:+.0%}) |"
        )


if __name__ == "__main__":
    main()
