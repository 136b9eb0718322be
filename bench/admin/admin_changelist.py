"""Times the operator console at 1M todos and 500k events: changelists under each filter, searches,
detail pages, the dashboard, and the batched "apply to every matching todo" run.

    .venv/bin/python bench/admin/admin_changelist.py [--rows 1000000] [--runs 5] [--reseed]

It uses the scratch database ``switchboard_bench_admin`` (bench/harness.py: on the embedded server, or
on the server of DATABASE_URL), migrates it, and seeds it once with generate_series (reused on later
runs unless --reseed). Requests go through Django's test client (the full admin stack: middleware,
templates, every query), logged in as a superuser. Prints a Markdown table: median and max
milliseconds over ``--runs`` requests after one warm-up, the median milliseconds of those spent in the
database, and the number of queries per request.

The seeded shape: 8 queues, 84% done, 8% pending, 1% claimed (most with lapsed leases), 2%
retry-waiting, 5% dead-letters (50,000 at 1M, each with five attempts' errors of ~1.5 KB, in twelve
kinds); 20 last claimers; 5 kinds, 3 sources, 10% assigned; one event per two todos;
created_at spread evenly over the last 30 days (so the newest ~1,400 rows fall in the last hour).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote_plus

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness as h

# The test settings (static files from the apps, no collectstatic) and the test client's host.
h.scratch_django(
    "admin", fresh=False, settings_module="switchboard.settings_test", ALLOWED_HOSTS="testserver,localhost,127.0.0.1"
)

from django.contrib.admin.utils import quote  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402

QUEUES = [f"queue-{q}" for q in range(8)]
# Which rows of the series are in which state: 84% done, 8% pending, 1% claimed, 2% retry-waiting, 5% dead
# (50,000 dead-letters at 1M: the outage the triage box and the every-matching actions are for).
MIX = {
    "done": "g %% 100 < 84",
    "pending": "g %% 100 BETWEEN 84 AND 91",
    "claimed": "g %% 100 = 92",
    "retry_waiting": "g %% 100 BETWEEN 93 AND 94",
    "dead": "g %% 100 >= 95",
}
FAILED_ONCE = """jsonb_build_array(jsonb_build_object(
    'attempt', 1, 'at', at + interval '10 seconds', 'error', 'upstream timed out'))"""
# A dead-letter's history as workers leave it: five attempts, each error a first line naming one of
# twelve causes, then ~1.5 KB of traceback that differs per row (so TOAST cannot compress it away).
# What the triage box groups by is the last error's first 120 characters: twelve groups.
DEAD_HISTORY = """(SELECT jsonb_agg(jsonb_build_object('attempt', i, 'at', at + i * interval '10 seconds', 'error',
    rpad((ARRAY['upstream timed out', 'KeyError: pr', 'model refused: rate limited', 'HTTP 502 from the API',
              'permission denied for repository', 'JSON decode error', 'out of memory', 'git clone failed',
              'context window exceeded', 'tool call returned garbage', 'lease lost', 'division by zero'])
         [1 + (g / 100) %% 12] || E'\nTraceback (most recent call last):', 120, ' ')
    || (SELECT string_agg(md5(g::text || i::text || k::text), E'\n') FROM generate_series(1, 45) k)))
    FROM generate_series(1, 5) i)"""
# Beyond its state's shape (bench/harness.py), what sets each state's rows apart here.
BY_STATE: dict[str, dict[str, str]] = {
    # The last claimer: twenty agents, and one rare one (20 todos) for the owner: search.
    "done": {
        "completed_at": "at + interval '5 seconds'",
        "owner": "CASE WHEN g %% 50000 = 17 THEN 'agent-rare' ELSE 'agent-' || (g %% 20) END",
    },
    "pending": {"claimed_at": "NULL"},
    # Leases of five minutes from created_at: all but the newest have lapsed.
    "claimed": {
        "owner": "'agent-' || (g %% 5)",
        "lease_expires_at": "at + interval '5 minutes'",
        "lease_id": "'ls_' || md5('l' || g)",
    },
    "retry_waiting": {
        "attempt": "2",
        "next_retry_at": "now() + (g %% 3600) * interval '1 second'",
        "errors": FAILED_ONCE,
    },
    "dead": {"attempt": "5", "errors": DEAD_HISTORY, "owner": "'agent-' || (g %% 20)"},
}


# Undo the batched run's retries (bench data only): back to dead-letters with their seeded history.
RESTORE_DEAD = """
UPDATE todos_todo SET state = 'failed', attempt = 5, max_attempts = 5, next_retry_at = NULL,
    errors = (SELECT jsonb_agg(e) FROM jsonb_array_elements(errors) e WHERE e ->> 'error' <> 'operator retry')
WHERE state = 'pending' AND errors @> '[{"error": "operator retry"}]'
"""


# The first group's value as the triage box links to it: the last error's first 120 characters.
GROUP = quote_plus("upstream timed out\nTraceback (most recent call last):".ljust(120))


def seed(rows: int, reseed: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos_todo")
        have = cursor.fetchone()[0]
        if have == rows and not reseed:
            print(f"reusing {have:,} seeded todos")
            return
        started = time.monotonic()
        cursor.execute("TRUNCATE todos_todo, events_event, todos_queue, django_admin_log CASCADE")
    h.seed_events(
        rows // 2,
        source="(ARRAY['github', 'stripe', 'linear'])[1 + g %% 3]",
        type="""(ARRAY['push', 'pull_request.opened', 'issue_comment.created', 'charge.failed', 'invoice.paid',
                'issue.updated', 'rare.type'])[1 + least(g %% 1000, 6)]""",
        payload="jsonb_build_object('n', g, 'ref', 'main', 'repository', jsonb_build_object('name', 'switchboard'))",
        received_at=f"now() - ({rows // 2} - g) * interval '5.2 seconds'",
    )
    common = {
        "id": "'td_' || md5('t' || g)",
        "source": "(ARRAY['github', 'stripe', 'linear'])[1 + g %% 3]",
        "kind": "(ARRAY['review', 'deploy', 'triage', 'notify', 'sync'])[1 + (g / 7) %% 5]",
        "title": "'Todo number ' || g",
        "payload": "jsonb_build_object('n', g, 'pr', g %% 5000)",
        "event_id": "'ev_' || md5(((g + 1) / 2)::text)",
        "idempotency_key": "'key-' || g",
        "assignee": "CASE WHEN g %% 10 = 0 THEN 'agent-' || (g %% 5) END",
        "claimed_at": "at + interval '1 second'",
        "updated_at": "at + interval '10 seconds'",
    }
    for state, where in MIX.items():
        h.seed_todos(
            rows,
            queue=QUEUES,
            state=state,
            where=where,
            created_at=f"now() - ({rows} - g) * interval '2.6 seconds'",
            **{**common, **BY_STATE[state]},
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE todos_todo")
        cursor.execute("VACUUM ANALYZE events_event")
    print(f"seeded {rows:,} todos and {rows // 2:,} events in {time.monotonic() - started:.0f} s")


def timed(client: Client, url: str, runs: int) -> tuple[float, float, float, int]:
    """Median and max wall milliseconds of the whole request, median milliseconds spent in the
    database (the sum of its queries' times), and the number of queries."""
    client.get(url)  # warm-up: connection, template caches
    times, db_times = [], []
    queries = 0
    for _ in range(runs):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code in (200, 302), (url, response.status_code)
        db_times.append(sum(float(q["time"]) for q in ctx.captured_queries) * 1000)
        queries = len(ctx.captured_queries)
    return statistics.median(times), max(times), statistics.median(db_times), queries


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reseed", action="store_true")
    args = parser.parse_args()

    seed(args.rows, args.reseed)
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "", "bench-pw-1")
    client = Client()
    client.force_login(user)

    todos = reverse("admin:todos_todo_changelist")
    events = reverse("admin:events_event_changelist")
    some_todo = "td_" + __import__("hashlib").md5(f"t{args.rows // 2}".encode()).hexdigest()
    some_event = "ev_" + __import__("hashlib").md5(f"{args.rows // 4}".encode()).hexdigest()
    cases = [
        ("todos, unfiltered", todos),
        ("todos, dead-letters, with the group-by-last-error box", todos + "?dead=yes"),
        ("todos, one last-error group of the dead-letters", todos + "?dead=yes&error=" + GROUP),
        ("todos, retry-waiting", todos + "?retry_waiting=yes"),
        ("todos, state=pending", todos + "?state=pending"),
        ("todos, state=claimed", todos + "?state=claimed"),
        ("todos, lease lapsed", todos + "?lapsed=yes"),
        ("todos, queue", todos + "?queue=queue-3"),
        ("todos, queue + dead-letters", todos + "?queue=queue-3&dead=yes"),
        ("todos, kind", todos + "?kind=deploy"),
        ("todos, assignee", todos + "?assignee=agent-0"),
        ("todos, source", todos + "?source=stripe"),
        ("todos, search exact id", todos + f"?q={some_todo}"),
        ("todos, search title text", todos + "?q=number+123456"),
        ("todos, search owner: (20 todos)", todos + "?q=owner%3Aagent-rare"),
        ("todos, search owner: (no match)", todos + "?q=owner%3Anobody"),
        ("todos, search key: (a done todo)", todos + "?q=key%3Akey-500000"),
        ("todos, search key: (a pending todo)", todos + "?q=key%3Akey-500088"),
        ("todos, page 50 of dead-letters", todos + "?dead=yes&p=50"),
        ("todo detail", reverse("admin:todos_todo_change", args=[quote(some_todo)])),
        ("events, unfiltered", events),
        ("events, source", events + "?source=stripe"),
        ("events, rare type", events + "?type=rare.type"),
        ("event detail", reverse("admin:events_event_change", args=[quote(some_event)])),
        ("dashboard", reverse("admin-dashboard")),
        ("dashboard JSON", reverse("admin-dashboard-json")),
        (
            "apply-to-all confirm page, dead-letters",
            reverse("admin:todos_todo_bulk", args=["retry_once"]) + "?dead=yes",
        ),
    ]
    print(f"\n| page ({args.rows:,} todos, {args.rows // 2:,} events) | median ms | max ms | db ms | queries |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, url in cases:
        median, worst, db, queries = timed(client, url, args.runs)
        print(f"| {label} | {median:.0f} | {worst:.0f} | {db:.0f} | {queries} |", flush=True)

    # The batched run: up to one request's cap (5,000) of dead-letters in one queue, retried once; then
    # the bench puts them back, so that every run measures the same table.
    from todos.admin import TodoAdmin
    from todos.models import Todo

    TodoAdmin.bulk_request_cap = 5000
    TodoAdmin.bulk_request_seconds = 120
    before = Todo.objects.filter(queue="queue-3").dead_lettered().count()
    url = reverse("admin:todos_todo_bulk", args=["retry_once"]) + "?dead=yes&queue=queue-3"
    started = time.perf_counter()
    response = client.post(url, {"note": "bench"})
    elapsed = time.perf_counter() - started
    done = before - Todo.objects.filter(queue="queue-3").dead_lettered().count()
    print(
        f"\napply-to-all, retry once, one request (status {response.status_code}): {done:,} of {before:,} "
        f"dead-letters in {elapsed:.1f} s, {done / elapsed:,.0f} todos/s, batches of {TodoAdmin.bulk_batch_size}"
    )
    with connection.cursor() as cursor:
        cursor.execute(RESTORE_DEAD)


if __name__ == "__main__":
    main()
