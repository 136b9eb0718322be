"""The claim's due-retry branch on stale statistics (issue 32): todo_failed_recent's old predicate (every failed
row) against today's (dead-letters only, migration 0042), in one run.

    .venv/bin/python bench/claim/due_trap.py                               # 20,000 pending, 50,000 dead-letters
    .venv/bin/python bench/claim/due_trap.py --pending 2000 --dead 5000 --claims 20 --rounds 2   # a smoke run

A plain queue's backlog is seeded and analyzed with no failed todo at all; then --dead dead-letters of another
queue arrive (autovacuum off for the table, so no ANALYZE follows). The rows alternate by round: "old" adds the
old index shape (updated_at) WHERE state = 'failed' beside today's, "today" drops it. Each row runs --claims
claims of the plain queue (CLAIM_NEXT, limit 1, as queue.claim_next runs it) under EXPLAIN ANALYZE, each rolled
back, and prints the median execution time, the rows the plan removed by filter and the indexes that served the
due branch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

OLD = "CREATE INDEX IF NOT EXISTS bench_failed_recent_old ON todos_todo (updated_at) WHERE state = 'failed'"


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pending", type=int, default=20000)
    parser.add_argument("--dead", type=int, default=50000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    h.scratch_django("due_trap")
    from django.db import connection, transaction

    from todos import sql
    from todos.models import Agent

    agent = Agent.objects.create(name="bench", claim_scopes=["*"], create_scopes=["*"])
    h.sb_sql("ALTER TABLE todos_todo SET (autovacuum_enabled = false)")
    h.sb_sql("INSERT INTO todos_queue (name, created_at) VALUES ('bench', now()), ('other', now())")
    columns = "id, queue, source, kind, title, payload, state, attempt, max_attempts, errors, created_at, updated_at"
    h.sb_sql(
        f"INSERT INTO todos_todo ({columns}, run_at, priority) SELECT 'td_' || i, 'bench', '', '', '', '{{}}', "
        f"'pending', 0, 5, '[]', now(), now(), now(), 0 FROM generate_series(1, {args.pending}) i"
    )
    h.sb_sql("ANALYZE todos_todo")  # no failed todo: every failed-row partial index is estimated empty
    h.sb_sql(
        f"INSERT INTO todos_todo ({columns}, run_at, priority) SELECT 'dl_' || i, 'other', '', '', '', '{{}}', "
        f"'failed', 5, 5, '[]', now(), now(), now(), 0 FROM generate_series(1, {args.dead}) i"
    )
    params: dict[str, Any] = {
        "scopes": ["%"],
        "wanted": ["bench"],
        "agent": agent.name,
        "owner": agent.name,
        "limit": 1,
        "lease_seconds": 60.0,
        "reserve": 0,  # the fair turn alone: this loop runs no CLAIM_FAIR_READY (issue 31)
    }
    results: dict[str, list[tuple[float, int, str]]] = {"old": [], "today": []}
    for _ in range(args.rounds):
        for variant in ("old", "today"):
            h.sb_sql(OLD if variant == "old" else "DROP INDEX IF EXISTS bench_failed_recent_old")
            for _ in range(args.claims):
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.CLAIM_NEXT, params)
                    document = cursor.fetchone()[0]
                    plan = json.loads(document) if isinstance(document, str) else document
                    transaction.set_rollback(True)
                nodes = _nodes(plan[0]["Plan"])
                removed = sum(int(n.get("Rows Removed by Filter", 0)) for n in nodes)
                due = sorted({str(n["Index Name"]) for n in nodes if "failed" in str(n.get("Index Name", ""))})
                due += sorted({str(n["Index Name"]) for n in nodes if n.get("Index Name") == "todo_retry_queue_due"})
                results[variant].append((float(plan[0]["Execution Time"]), removed, ",".join(due)))
    print(f"due trap: {args.pending} pending, {args.dead} dead-letters of another queue, stale statistics")
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")
    print(f"{'index':8} {'claims':>6} {'median ms':>10} {'rows removed':>13}  due branch served by")
    for variant, rows in results.items():
        ms = h.median([r[0] for r in rows])
        removed = int(h.median([float(r[1]) for r in rows]))
        print(f"{variant:8} {len(rows):>6} {ms:>10.3f} {removed:>13}  {sorted({r[2] for r in rows})}")


if __name__ == "__main__":
    main()
