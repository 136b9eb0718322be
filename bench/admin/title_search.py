"""The admin's free-text title search at 1M todos, with and without the trigram index (todos 0010), and
what that index costs the queue's transitions.

    .venv/bin/python bench/admin/title_search.py [--rows 1000000] [--runs 5] [--cycles 1000]

Uses bench/admin/admin_changelist.py's scratch database and seed (seeds it if needed). For each state of the
index (present, dropped, rebuilt) it times the todo changelist with three searches through the full
admin stack, then makes ``--cycles`` creates and as many claim + complete cycles through
todos/queue/ (one client), timing them and counting the WAL they write. Every transition is a
non-HOT update (it changes indexed columns), so each one also inserts into the GIN index, as each
create does. The index is dropped and rebuilt in the scratch database only; runs go with, without,
with, without.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# Importing admin_changelist sets Django up on its scratch database (bench/harness.py's scratch_django).
from bench.admin import admin_changelist

seed, timed = admin_changelist.seed, admin_changelist.timed

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

from todos import queue  # noqa: E402
from todos.models import Agent  # noqa: E402

INDEX = "todo_title_trgm"
SEARCHES = [
    ("rare text (a handful of rows)", "number 123456"),
    ("common text (~11k rows)", "number 99"),
    ("no match", "zebra"),
]


def index_definition() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [INDEX])
        row = cursor.fetchone()
    return row[0] if row else None


def _wal() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def writes(agent: Agent, n: int) -> tuple[float, float, float, float]:
    """n creates, then n claim + complete cycles, in a queue of their own (the seeded backlog and its
    lapsed leases stay out of the claims): (creates/s, WAL bytes per create, cycles/s, WAL bytes per
    cycle). WAL bytes do not depend on the machine's load, so they show the index's write cost even
    where the rates are noise."""
    wal, started = _wal(), time.perf_counter()
    for i in range(n):
        queue.create(queue="bench-trgm", title=f"Bench todo number {i} for the trigram write cost")
    create_rate, create_wal = n / (time.perf_counter() - started), (_wal() - wal) / n
    wal, started = _wal(), time.perf_counter()
    for _ in range(n):
        [todo] = queue.claim_next(agent=agent, queues=["bench-trgm"])
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id, result={"ok": True})
    return create_rate, create_wal, n / (time.perf_counter() - started), (_wal() - wal) / n


def measure(label: str, client: Client, agent: Agent, args: argparse.Namespace) -> None:
    url = reverse("admin:todos_todo_changelist")
    for what, term in SEARCHES:
        median, worst, db, _ = timed(client, f"{url}?q={term.replace(' ', '+')}", args.runs)
        print(f"| {label} | search: {what} | {median:.0f} ms | {worst:.0f} ms | {db:.0f} ms |", flush=True)
    create_rate, create_wal, cycle_rate, cycle_wal = writes(agent, args.cycles)
    print(f"| {label} | create (1 client) | {create_rate:.0f}/s | | {create_wal:,.0f} WAL bytes each |", flush=True)
    print(f"| {label} | claim+complete (1 client) | {cycle_rate:.0f}/s | | {cycle_wal:,.0f} WAL bytes each |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=1000)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    seed(args.rows, reseed=False)
    definition = index_definition()
    assert definition, f"{INDEX} is missing: migrate first"
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "", "bench-pw-1")
    client = Client()
    client.force_login(user)
    agent = Agent.objects.filter(name="bench-worker").first()
    if agent is None:
        agent = Agent(name="bench-worker", claim_scopes=["*"], create_scopes=["*"])
        agent.set_new_token()
        agent.save()
    writes(agent, 200)  # warm-up

    print(f"\n| index ({args.rows:,} todos) | measure | median | max | db / WAL |")
    print("| --- | --- | ---: | ---: | ---: |")
    built = []
    # A, B, A, B: on a shared machine the order of runs matters as much as the index.
    for round_ in (1, 2):
        measure(f"with the trigram index ({round_})", client, agent, args)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX {INDEX}")
        measure(f"without it ({round_})", client, agent, args)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(definition)
            cursor.execute(f"SELECT pg_size_pretty(pg_relation_size('{INDEX}'))")
            size = cursor.fetchone()[0]
        built.append(time.perf_counter() - started)
    print(f"\nbuilding {INDEX} took {' and '.join(f'{b:.0f} s' for b in built)}; its size: {size}")


if __name__ == "__main__":
    main()
