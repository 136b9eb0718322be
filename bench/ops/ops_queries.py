"""The operations queries on 1M todos: the /metrics queue-state statement and retention's batches.

    .venv/bin/python bench/ops/ops_queries.py [--rows 1000000] [--purge]

Uses the scratch database switchboard_bench_ops (bench/harness.py: on the embedded server, or on the
server of DATABASE_URL). Seeds once: 90% done (completed over the
last 14 days), 8% pending, and claimed, retry-waiting and dead-lettered rows over 20 queues, plus
events; then prints each statement's plan and its median time over several runs. --purge then runs
the real purge (7/90 days) and reports batch times: the longest any lock is held.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness as h

h.scratch_django("ops", fresh=False, DEBUG="true")

from django.db import connection  # noqa: E402

from todos import retention, sql, states  # noqa: E402

ALL_QUEUES = {"visible": ["%"]}

QUEUES = [f"queue-{q}" for q in range(20)]


def seed(rows: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos_todo")
        if cursor.fetchone()[0] >= rows:
            return
        cursor.execute("TRUNCATE todos_todo, events_event CASCADE")
    done, pending, claimed = int(rows * 0.90), int(rows * 0.08), int(rows * 0.002)
    events = rows // 20
    started = time.monotonic()
    h.seed_events(
        events,
        id="'ev_' || g",
        delivery_id="'d' || g",
        received_at="now() - (g %% 14) * interval '1 day' - interval '1 hour'",
    )
    # Row g of the whole series: done first, then pending, claimed and failed (every 6th waiting for a
    # retry, the rest dead-letters), over 20 queues and 14 days; every 10th todo belongs to an event (two
    # per event).
    shape = {
        "id": "'td_' || g",
        "source": "''",
        "kind": "'job'",
        "title": "'a todo'",
        "payload": """'{"n": 1}'::jsonb""",
        "event_id": f"CASE WHEN g %% 10 = 0 AND (g / 10 + 1) / 2 <= {events} THEN 'ev_' || ((g / 10 + 1) / 2) END",
        "created_at": "now() - (g %% 336) * interval '1 hour'",
        "updated_at": "now() - (g %% 2880) * interval '1 hour'",
    }
    failed = rows - done - pending - claimed
    h.seed_todos(done, queue=QUEUES, state="done", **shape)
    h.seed_todos(pending, queue=QUEUES, first=done + 1, **shape)
    h.seed_todos(claimed, queue=QUEUES, state="claimed", first=done + pending + 1, **shape)
    first_failed = done + pending + claimed + 1
    h.seed_todos(failed, queue=QUEUES, state="retry_waiting", first=first_failed, where="g %% 6 = 0", **shape)
    h.seed_todos(failed, queue=QUEUES, state="dead", first=first_failed, where="g %% 6 <> 0", **shape)
    print(f"seeded {rows:,} todos in {time.monotonic() - started:.1f}s")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE todos_todo")
        cursor.execute("VACUUM ANALYZE events_event")


def timed(sql: str, params: dict | None = None, runs: int = 7) -> float:
    times = []
    with connection.cursor() as cursor:
        for _ in range(runs):
            started = time.perf_counter()
            cursor.execute(sql, params)
            if cursor.description:
                cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def explain(label: str, sql: str, params: dict | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
        cursor.execute("ROLLBACK")
    print(f"\n--- {label}")
    print("\n".join(plan))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--purge", action="store_true", help="Then run the real purge and time its batches.")
    args = parser.parse_args()
    seed(args.rows)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT state, ({states.NO_RETRY.sql()}), count(*) FROM todos_todo GROUP BY 1, 2 ORDER BY 1, 2")
        print("rows:", cursor.fetchall())

    params = {"done_age": 7 * retention.DAY, "dead_age": 90 * retention.DAY, "batch": 1000}
    explain("queue stats (/metrics)", sql.QUEUE_STATS, ALL_QUEUES)
    explain("purge done, one batch", sql.PURGE_DONE, params)
    explain("purge dead, one batch", sql.PURGE_DEAD, params)
    explain(
        "purge events, one page",
        sql.EVENT_PAGE,
        {**params, "after_at": "-infinity", "after_id": ""},
    )
    print("\nmedian ms over 7 runs:")
    print(f"  queue stats (/metrics)  {timed(sql.QUEUE_STATS, ALL_QUEUES):8.1f}")
    print(f"  purge --dry-run counts  {timed(sql.COUNT_PURGEABLE, params, runs=3):8.1f}")
    done_count = "SELECT queue, count(*) FROM todos_todo WHERE state = 'done' GROUP BY queue"
    print(f"  (done by queue, left out of /metrics)  {timed(done_count, runs=3):8.1f}")

    if args.purge:
        batch_times: list[float] = []
        started = time.monotonic()
        with connection.cursor() as cursor:
            for statement in (sql.PURGE_DONE, sql.PURGE_DEAD):
                while True:
                    t0 = time.perf_counter()
                    cursor.execute(statement, params)
                    batch_times.append((time.perf_counter() - t0) * 1000)
                    if cursor.rowcount < params["batch"]:
                        break
        todos_elapsed = time.monotonic() - started
        t0 = time.monotonic()
        result = retention.purge(done_days=7, dead_days=90, batch=1000)  # the events that are now orphaned
        print(
            f"\npurge: {len(batch_times)} todo batches of <=1000 in {todos_elapsed:.1f}s; "
            f"batch ms median {statistics.median(batch_times):.1f}, p99 "
            f"{sorted(batch_times)[int(len(batch_times) * 0.99) - 1]:.1f}, max {max(batch_times):.1f}; "
            f"then {result.events:,} events in {time.monotonic() - t0:.1f}s"
        )


if __name__ == "__main__":
    main()
