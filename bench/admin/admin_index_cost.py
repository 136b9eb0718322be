"""What the admin's indexes cost the queue: claim + complete cycles on the 1M-row scratch database of
bench/admin/admin_changelist.py, with a set of indexes, without them, and with them again.

    .venv/bin/python bench/admin/admin_index_cost.py [--cycles 3000] [--set filters|searches]

``filters``: the changelist's filter indexes (todos 0004, as 0006 left them). ``searches``: the indexes of
todos 0019 (owner: and key: searches, one triage group, per-queue retry reads).

Run bench/admin/admin_changelist.py first (it seeds the database). One client, each cycle one claim_next
and one complete through todos/queue/ (two statements, two transactions). The indexes are dropped
and rebuilt in the scratch database only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness as h

h.scratch_django("admin", fresh=False)

from django.db import connection  # noqa: E402

from todos import queue  # noqa: E402
from todos.models import Agent, Todo  # noqa: E402

INDEX_SETS = {
    "filters": [
        "todo_admin_recent",
        "todo_admin_kind_recent",
        "todo_admin_source_recent",
        "todo_admin_assignee_recent",
        "todo_done_recent",
        "todo_failed_recent",
    ],
    "searches": ["todo_admin_owner_recent", "todo_admin_key", "todo_dead_last_error", "todo_retry_queue_due"],
}


def index_definitions(names: list[str]) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [names])
        return dict(cursor.fetchall())


def cycles(agent: Agent, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        [todo] = queue.claim_next(agent=agent)
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id, result={"ok": True})
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--set", choices=sorted(INDEX_SETS), default="filters")
    args = parser.parse_args()
    names = INDEX_SETS[args.set]
    if Todo.objects.count() < 100_000:
        sys.exit("Seed the scratch database first: bench/admin/admin_changelist.py")
    agent = Agent.objects.filter(name="bench-worker").first()
    if agent is None:
        agent = Agent(name="bench-worker", claim_scopes=["*"], create_scopes=["*"])
        agent.set_new_token()
        agent.save()
    definitions = index_definitions(names)
    assert len(definitions) == len(names), definitions
    cycles(agent, 200)  # warm-up
    with_1 = cycles(agent, args.cycles)
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"DROP INDEX {name}")
    without = cycles(agent, args.cycles)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for definition in definitions.values():
            cursor.execute(definition)
    rebuilt = time.perf_counter() - started
    with_2 = cycles(agent, args.cycles)
    print(f"claim+complete cycles/s, 1 client, {args.cycles} cycles each, 1M-row table:")
    print(f"  with the {args.set} indexes {with_1:7.0f}")
    print(f"  without them               {without:7.0f}")
    print(f"  with them again            {with_2:7.0f}   (rebuilding all {len(names)} took {rebuilt:.0f} s)")


if __name__ == "__main__":
    main()
