"""The operations queries on 1M todos: the /metrics queue-state statement and retention's batches.

    .venv/bin/python bench/ops_queries.py [--rows 1000000] [--purge]

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness as h

h.scratch_django("ops", fresh=False, DEBUG="true")

from django.db import connection  # noqa: E402

from switchboard.metrics import QUEUE_STATS_SQL  # noqa: E402
from todos import retention  # noqa: E402

SEED = [
    """INSERT INTO todos_queue (name, created_at)
    SELECT 'queue-' || q, now() FROM generate_series(0, 19) q ON CONFLICT DO NOTHING""",
    """INSERT INTO events_event (id, source, type, delivery_id, payload, headers, received_at)
    SELECT 'ev_' || i, 'github', 'push', 'd' || i, '{}', '{}',
        now() - (i %% 14) * interval '1 day' - interval '1 hour'
    FROM generate_series(1, %(events)s) i""",
    # Every 10th todo belongs to an event (two per event).
    """INSERT INTO todos_todo (id, queue, source, kind, title, payload, event_id, idempotency_key, assignee, state,
        owner, lease_expires_at, attempt, max_attempts, result, created_at, updated_at, claimed_at, completed_at,
        next_retry_at, lease_id, errors)
    SELECT 'td_' || i, 'queue-' || (i %% 20), '', 'job', 'a todo', '{"n": 1}',
        CASE WHEN i %% 10 = 0 AND (i / 10 + 1) / 2 <= %(events)s THEN 'ev_' || ((i / 10 + 1) / 2) END,
        NULL, NULL,
        CASE WHEN i <= %(done)s THEN 'done'
             WHEN i <= %(done)s + %(pending)s THEN 'pending'
             WHEN i <= %(done)s + %(pending)s + %(claimed)s THEN 'claimed'
             ELSE 'failed' END,
        NULL,
        CASE WHEN i > %(done)s + %(pending)s AND i <= %(done)s + %(pending)s + %(claimed)s
             THEN now() + interval '5 minutes' END,
        1, 5, NULL,
        now() - (i %% 336) * interval '1 hour', now() - (i %% 2880) * interval '1 hour', NULL,
        CASE WHEN i <= %(done)s THEN now() - (i %% 336) * interval '1 hour' END,
        CASE WHEN i > %(done)s + %(pending)s + %(claimed)s AND i %% 6 = 0 THEN now() + interval '1 hour' END,
        NULL, '[]'
    FROM generate_series(1, %(rows)s) i""",
]


def seed(rows: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos_todo")
        if cursor.fetchone()[0] >= rows:
            return
        cursor.execute("TRUNCATE todos_todo, events_event CASCADE")
        done, pending, claimed = int(rows * 0.90), int(rows * 0.08), int(rows * 0.002)
        started = time.monotonic()
        params = {"rows": rows, "done": done, "pending": pending, "claimed": claimed, "events": rows // 20}
        for statement in SEED:
            cursor.execute(statement, params)
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
        cursor.execute("SELECT state, (next_retry_at IS NULL), count(*) FROM todos_todo GROUP BY 1, 2 ORDER BY 1, 2")
        print("rows:", cursor.fetchall())

    params = {"done_age": 7 * retention.DAY, "dead_age": 90 * retention.DAY, "batch": 1000}
    explain("queue stats (/metrics)", QUEUE_STATS_SQL)
    explain("purge done, one batch", retention.PURGE_DONE, params)
    explain("purge dead, one batch", retention.PURGE_DEAD, params)
    explain(
        "purge events, one page",
        retention.EVENT_PAGE,
        {**params, "after_at": "-infinity", "after_id": ""},
    )
    print("\nmedian ms over 7 runs:")
    print(f"  queue stats (/metrics)  {timed(QUEUE_STATS_SQL):8.1f}")
    print(f"  purge --dry-run counts  {timed(retention.COUNT_PURGEABLE, params, runs=3):8.1f}")
    done_count = "SELECT queue, count(*) FROM todos_todo WHERE state = 'done' GROUP BY queue"
    print(f"  (done by queue, left out of /metrics)  {timed(done_count, runs=3):8.1f}")

    if args.purge:
        batch_times: list[float] = []
        started = time.monotonic()
        with connection.cursor() as cursor:
            for statement in (retention.PURGE_DONE, retention.PURGE_DEAD):
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
