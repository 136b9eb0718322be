"""Ingest with event waits open (issue 20): what 100,000 open waits cost each stored delivery.

    .venv/bin/python bench/ingest/ingest_waits.py [--waits 100000] [--deliveries 300] [--rounds 3]

Scratch database ``switchboard_bench_waits`` (bench/harness.py). It seeds ``--waits`` waiting todos, each
with an open waitpoint for a GitHub ``check_suite.*`` event of source ``gh`` matching its own
``check_suite.head_sha`` (the keys computed by todos/waitpoints.py, as queue.wait would), then times
``ingest.intake.store_and_route`` in process (the receiver's transaction: event INSERT, routes, and the
waits it resolves) for ``--deliveries`` check_suite deliveries of about 6 KB, in rounds alternating:

* no waits open (the waitpoints closed),
* the waits open, interleaved: deliveries matching none of them, each matching (and resolving) one, and
  deliveries of another source.

It prints the median and p99 milliseconds per delivery of each (and the median spent in
queue.resolve_events), and the plan of RESOLVE_EVENTS for one
delivery (index probes on waitpoint_event_key, one per scalar leaf of the payload, never a scan).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness as h

h.scratch_django("waits")

from django.db import connection  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from ingest import intake  # noqa: E402
from todos import queue, sql, waitpoints  # noqa: E402

SOURCE = "gh"
PATH = "check_suite.head_sha"


def payload(sha: str) -> dict:
    # The shape of a GitHub check_suite delivery: ~90 scalar leaves outside arrays, about 6 KB.
    return {
        "action": "completed",
        "check_suite": {
            "id": 1,
            "head_branch": "main",
            "head_sha": sha,
            "status": "completed",
            "conclusion": "success",
            "app": {"id": 15368, "slug": "github-actions", "owner": {f"k{i}": f"v{i}" for i in range(20)}},
            "pull_requests": [{"number": 7, "head": {"sha": sha}}],
        },
        "repository": {f"field_{i}": f"value {i} " * 8 for i in range(40)},
        "sender": {f"s{i}": i for i in range(20)},
    }


def seed(waits: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos_todo, todos_waitpoint, events_event CASCADE")
        shas = [f"sha-{i:08d}" for i in range(waits)]
        keys = [waitpoints.event_key(SOURCE, PATH, s) for s in shas]
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                created_at, updated_at, run_at, priority, waiting_for)
            SELECT 'td_w' || lpad(g::text, 12, '0'), 'reviews', '', 'review', 'waiting ' || g, '{}'::jsonb,
                'waiting', 0, 5, '[]'::jsonb, now(), now(), now(), 0,
                jsonb_build_object('event', jsonb_build_object('source', 'gh', 'type', 'check_suite.*'))
            FROM generate_series(0, %(n)s - 1) g
            """,
            {"n": waits},
        )
        cursor.execute(
            """
            INSERT INTO todos_waitpoint (todo_id, queue, created_at, timeout_at, on_timeout, event_source,
                event_type_like, event_match, event_key)
            SELECT 'td_w' || lpad((k.n - 1)::text, 12, '0'), 'reviews', now() - interval '1 minute',
                now() + interval '30 days', 'pending', 'gh', 'check\\_suite.%%',
                jsonb_build_object('check_suite', jsonb_build_object('head_sha', k.sha)), k.key
            FROM unnest(%(shas)s::text[], %(keys)s::text[]) WITH ORDINALITY AS k(sha, key, n)
            """,
            {"shas": shas, "keys": keys},
        )
        cursor.execute("ANALYZE todos_todo")
        cursor.execute("ANALYZE todos_waitpoint")


def set_open(is_open: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE todos_waitpoint SET resolved_at = CASE WHEN %s THEN NULL ELSE now() END", [is_open])
        cursor.execute("VACUUM ANALYZE todos_waitpoint")


def deliver(source: str, sha: str) -> tuple[float, float]:
    """One stored delivery: its milliseconds in store_and_route, and of those in resolve_events alone."""
    body = payload(sha)
    spent = {"resolve": 0.0}
    resolve = queue.resolve_events

    def timed_resolve(**kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return resolve(**kw)
        finally:
            spent["resolve"] = (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    with mock_attr(queue, "resolve_events", timed_resolve):
        intake.store_and_route(
            source=source,
            event_type="check_suite.completed",
            delivery_id=str(uuid.uuid4()),
            payload=body,
            headers={},
            routes=[],
        )
    return (time.perf_counter() - started) * 1000, spent["resolve"]


class mock_attr:
    """Swap a module attribute for the length of a with block (a timing wrapper, not a test double)."""

    def __init__(self, module: Any, name: str, value: Any) -> None:
        self.module, self.name, self.value = module, name, value

    def __enter__(self) -> None:
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc: object) -> None:
        setattr(self.module, self.name, self.saved)


def plan(waits: int) -> str:
    body = payload(f"sha-{waits - 1:08d}")  # one the timed rounds left open
    params = {
        "keys": waitpoints.delivery_keys(SOURCE, body),
        "source": SOURCE,
        "type": "check_suite.completed",
        "payload": Jsonb(body),
        "received_at": "now",
        "event_id": "ev_plan",
    }
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql.RESOLVE_EVENTS, params)
        # The key list and the payload make lines of kilobytes: cut them.
        lines = [row[0] if len(row[0]) <= 150 else row[0][:147] + "..." for row in cursor.fetchall()]
        cursor.execute("ROLLBACK")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waits", type=int, default=100_000)
    parser.add_argument("--deliveries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    started = time.perf_counter()
    seed(args.waits)
    print(f"seeded {args.waits:,} waiting todos and waitpoints in {time.perf_counter() - started:.1f} s")
    print(
        f"one delivery yields {len(waitpoints.delivery_keys(SOURCE, payload('x')))} keys, "
        f"{len(json.dumps(payload('x')))} bytes"
    )
    cases = ("no waits open", "100k open, no match", "100k open, one match", "100k open, another source")
    results: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
    resolved = 0
    for _ in range(args.rounds):
        set_open(False)
        results[cases[0]] += [deliver(SOURCE, f"nothing-{i}") for i in range(args.deliveries)]
        set_open(True)
        # Interleaved, so that the machine's load falls on the three alike.
        for i in range(args.deliveries):
            results[cases[1]].append(deliver(SOURCE, f"nothing-{i}"))
            results[cases[2]].append(deliver(SOURCE, f"sha-{resolved:08d}"))
            results[cases[3]].append(deliver("quiet", f"sha-{resolved:08d}"))
            resolved += 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos_todo WHERE state = 'pending'")
        pending = cursor.fetchone()[0]
    print(f"todos resolved by matching deliveries: {pending} (expected {min(resolved, args.waits)})")
    print("\n| deliveries | n | median ms | p99 ms | resolve_events median ms |\n| --- | --- | --- | --- | --- |")
    for name, pairs in results.items():
        times = sorted(t for t, _ in pairs)
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        resolve_ms = statistics.median(r for _, r in pairs)
        print(f"| {name} | {len(times)} | {statistics.median(times):.2f} | {p99:.2f} | {resolve_ms:.2f} |")
    print("\nRESOLVE_EVENTS plan (one delivery matching one wait):\n")
    print(plan(args.waits))


if __name__ == "__main__":
    main()
