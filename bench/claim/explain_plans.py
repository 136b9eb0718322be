"""EXPLAIN (ANALYZE, BUFFERS) of every statement in todos/sql/ that matters, on a table of ~1M todos,
written to docs/query-plans.md with a one-line reading of each plan.

    .venv/bin/python bench/claim/explain_plans.py            # seeds switchboard_bench_explain once, then explains
    .venv/bin/python bench/claim/explain_plans.py --reseed   # throw the rows away and seed again
    .venv/bin/python bench/claim/explain_plans.py --scheduled 0 --reseed   # without the scheduled million

The mix is a service some months in: mostly done history, ~50k pending over four queues (priorities -3..3),
some live and some lapsed claims, retries waiting (a few due) and dead-letters; and, beside it, 1M todos
scheduled for later in the same four queues with priorities -100..100, a few hundred of them due
(--scheduled N changes the million; 0 leaves them out). Seeding is INSERT ... SELECT
generate_series: seconds, not minutes. Every EXPLAIN ANALYZE of a write runs in a transaction that is
rolled back, so the table is the same for each plan.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness as h

# Reused between runs: seeding 1M rows is the slow part, and the rows do not change between plans.
h.scratch_django("explain", fresh=False)

from django.db import connection, transaction  # noqa: E402
from django.db.models import Count  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from todos import sql  # noqa: E402
from todos.models import Todo  # noqa: E402

OUT = h.ROOT / "docs" / "query-plans.md"
TOTAL = 1_000_000
# queue -> pending rows: two busy queues, two quiet ones (SPEC trap 1 is about exactly this spread).
PENDING = {"github.push": 25_000, "github.pull_request": 15_000, "stripe.charge": 8_000, "email.send": 2_000}
QUEUES = [*PENDING, "ci.build", "slack.notify"]
MIX = {  # state -> rows; done fills the rest of TOTAL
    "claimed_live": 2_000,
    "claimed_lapsed": 500,
    "retry_waiting": 5_000,
    "retry_due": 300,
    "dead": 3_000,
}
# Beside TOTAL: todos scheduled for later (over the coming 30 days) and a few due ones the reaper has not
# promoted yet, spread over the four busy queues and ci.build (which has nothing pending: a claim there
# finds only future rows).
SCHEDULED = 1_000_000
SCHEDULED_DUE = 200


def seed_scheduled(n: int) -> None:
    """n todos scheduled for later (one every 2.5 s from now, priorities -100..100) and SCHEDULED_DUE due ones
    the reaper has not promoted yet, over the four busy queues and ci.build."""
    later_queues = [*PENDING, "ci.build"]
    common = {"id": "'td_' || replace(gen_random_uuid()::text, '-', '')", "source": "'api'", "kind": "'later'"}
    for count, run_at in (
        (n, "now() + g * interval '2.5 s'"),
        (SCHEDULED_DUE if n else 0, "now() - g * interval '1 s'"),
    ):
        h.seed_todos(
            count,
            queue=later_queues,
            state="scheduled",
            created_at="now() - interval '1 day'",
            title="'later #' || g",
            run_at=run_at,
            priority="g %% 201 - 100",
            **common,
        )


# Beyond its state's shape (bench/harness.py), what sets each state's rows apart here.
BY_STATE: dict[str, dict[str, str]] = {
    "claimed_live": {"state": "claimed", "owner": "'worker'", "created_at": "now() - interval '2 hours'"},
    "claimed_lapsed": {  # some at their cap
        "state": "lapsed",
        "owner": "'worker'",
        "attempt": "1 + g %% 5",
        "created_at": "now() - interval '2 hours'",
    },
    "retry_waiting": {"state": "retry_waiting", "created_at": "now() - interval '2 hours'"},
    "retry_due": {"state": "retry_due", "created_at": "now() - interval '2 hours'"},
    "dead": {"state": "dead", "created_at": "now() - interval '3 days'", "updated_at": "now() - g * interval '1 min'"},
}


def seed(scheduled: int = SCHEDULED) -> None:
    started = time.monotonic()
    done = TOTAL - sum(PENDING.values()) - sum(MIX.values())
    common = {"id": "'td_' || replace(gen_random_uuid()::text, '-', '')", "source": "'github'", "kind": "'event'"}
    with connection.cursor() as cur:
        cur.execute("TRUNCATE todos_todo, todos_queue")
    # History: done over the last 30 days, spread over all queues.
    h.seed_todos(
        done,
        queue=QUEUES,
        state="done",
        created_at="now() - interval '30 days' + g * interval '2 seconds'",
        title="'done #' || g",
        payload="jsonb_build_object('n', g)",
        idempotency_key="'done-' || g",
        owner="'worker'",
        updated_at="at",
        **common,
    )
    # Pending: the last hour, per queue.
    for q, n in PENDING.items():
        h.seed_todos(
            n,
            queue=q,
            created_at="now() - interval '1 hour' + g * interval '50 ms'",
            title="'pending #' || g",
            payload="jsonb_build_object('n', g)",
            idempotency_key=f"'pending-{q}-' || g",
            priority="g %% 7 - 3",
            **common,
        )
    # The rest over the four busy queues.
    for name, n in MIX.items():
        shape = dict(BY_STATE[name])
        h.seed_todos(
            n,
            queue=QUEUES[:4],
            state=shape.pop("state"),
            created_at=shape.pop("created_at"),
            title=f"'{name} #' || g",
            idempotency_key=f"'{name}-' || g",
            **common,
            **shape,
        )
    seed_scheduled(scheduled)
    with connection.cursor() as cur:
        # VACUUM cannot run inside a transaction; Django's connection is in autocommit here.
        cur.execute("VACUUM (ANALYZE) todos_todo")
    print(f"seeded {TOTAL + scheduled:,} todos in {time.monotonic() - started:.1f}s")


# The reading of each plan as measured (docs/query-plans.md): what it does and why that is fine. The
# facts line after it (indexes, rows, buffers) is computed from the plan on every run.
NOTES = {
    "claim_next, one queue with max_claimed and a rate limit, limit 10": "The queue's todos_queue row is "
    "locked (claimers of a limited queue take turns), todos_live_leases() counts its live leases from "
    "todo_live_leases, and the bucket's write-back updates that one row; the scan is the unlimited one.",
    "claim_next, one fair queue, 1,000 keys, max_claimed_per_key 2, limit 10": "The queue's row is "
    "locked FOR NO KEY UPDATE (issue 31: fair claimers take turns, until commit; the claim commits without "
    "waiting for its flush, fair_commit). todos_fair_walk (a function, so its reads see claims committed after "
    "the statement's snapshot; estimated at 4 rows, not 1,000) reads todos_fairkey in pass order, checks each "
    "key for pending work at the queue's top priority (an EXISTS on todo_fair_pending) and its live leases "
    "(todos_fair_live_leases), and locks the first 10 FOR NO KEY UPDATE SKIP LOCKED; then one descent of "
    "todo_fair_pending per key from its first pending todo now (todos_fair_key_first, a fresh snapshot), one todo "
    "each (weight 1); the passes are written back by an update of those 10 "
    "rows. Plain queues never run this statement (CLAIM_NEXT claims for them; queue.claim_next runs this one "
    "only when CLAIM_NEXT says a keyed queue is eligible). A queue with max_claimed_per_key never reserves "
    "(issue 31's reservations): the contention probe and todos_fairready's nodes are here but empty, and "
    "todos_fair_reserved's per-row check of the key scans (todos_fairready's primary key, inside the function) "
    "finds nothing; fair_ready_claim is read by the 'has reservations' probe. The fast claim of reserved "
    "todos (CLAIM_FAIR_READY) is one range scan of "
    "fair_ready_claim per queue and the primary key: its plan is checked by todos/tests/test_claim_plan.py.",
    "claim_next's plain statement on a fair queue (it takes nothing and says so)": "What a fair queue's "
    "claim pays before CLAIM_NEXT_FAIR: the queue row, read as for any claim, is keyed, so ``quotas`` and "
    "``limited`` are empty, no todo is locked, and the statement answers its row of NULLs. Its buffers are the "
    "lapsed branch's walk of the lapsed leases in expiry order (every claim of these queues walks it, see "
    "below): with nothing to match it reads all 500 here, few while the reaper keeps them few.",
    "cancel (one id)": "One row by primary key; the NOTIFY wakes waiters of a queue whose slot it freed.",
    "claim_next, one queue, limit 1": "One descent of todo_pending_claim_scan for the queue, in claim order "
    "(priority, run_at); one descent of todo_scheduled_due for the queue's due scheduled todos, a range "
    "run_at <= now() that stops at the first future row (the 250k future rows of this queue are never read); "
    "the lapsed branch walks its small partial index in expiry order, and the due branch is one descent of "
    "todo_retry_queue_due per queue (migration 0019); both stop at the first row.",
    "claim_next, one queue, limit 1, nothing pending (only future scheduled todos)": "The worst case for "
    "future rows: ci.build has nothing pending and 200k todos scheduled for later (and a few dozen due). The "
    "scheduled branch reads the due entries and stops at the first future one (5 buffers): the future rows cost "
    "the claim nothing. Most of the buffers here are the lapsed-lease branch stepping over other queues' lapsed "
    "leases (see above), not scheduling.",
    "claim (one id) of a todo scheduled for later": "Primary-key lookup; the guard refuses it (0 rows), and "
    "the API answers 409 scheduled.",
    "promote_due_scheduled (reaper), batch 500": "Per registered queue, the due range of todo_scheduled_due "
    "(a few hundred rows), locked, then updated by primary key; the million future rows are not read.",
    "seconds_until_claimable (a long-poll's next wake)": "One descent of todo_scheduled_due per queue for "
    "its earliest run_at (LIMIT 1), and one of todo_retry_queue_due for its next due retry (migration 0019: "
    "todo_retry_due, without the queue, walked every queue's retries), beside the lapsed-lease minimum.",
    "queue_stats, one queue (an agent's GET /api/v1/queues/)": "One aggregate per live state, each from its "
    "partial index; retry-waiting from todo_retry_queue_due, the queue's own entries (migration 0019: "
    "todo_retry_due read every queue's retry-waiting rows and kept this queue's).",
    "create scheduled for later": "The same insert as a plain create (one more index entry, in "
    "todo_scheduled_due instead of todo_pending_claim_scan); no NOTIFY unless due within 20 s.",
    "claim_next, all six queues (scope '*'), limit 1": "One descent of the pending index per queue (six, "
    "named by todos_queue), never a sort of the 50k pending rows (SPEC trap 1). The planner guesses one "
    "lapsed and one due row, so it hashes and sorts all of them (a few hundred): cheap while the reaper keeps "
    "them few.",
    "claim_next, two queues, batch of 10": "Two descents of the pending index, 10 rows each, and two of the "
    "scheduled index; the final LIMIT keeps the first 10 candidates in claim order and the UPDATE finds them "
    "by primary key.",
    "claim_next, all queues, limit 1, with 15,500 lapsed leases (a crashed fleet, before a sweep)": "Lapsed "
    "leases come out of todo_claimed_lease_expiry in expiry order (one row read). The pending scan of "
    "github.pull_request steps over the index entries of the 15,000 rows that just left pending (dead until "
    "vacuumed): why migration 0002 vacuums the table on a fixed threshold.",
    "claim (one id)": "Primary-key lookup of one row; the guard is a filter on it.",
    "heartbeat": "Primary-key lookup of one row.",
    "complete": "Primary-key lookup of one row.",
    "fail": "Primary-key lookup of one row.",
    "requeue_lapsed (reaper), batch 500": "Lapsed leases in expiry order from todo_claimed_lease_expiry, "
    "locked, then updated by primary key; most buffers are the index entries each (non-HOT) update writes.",
    "promote_due_retries (retry scheduler), batch 500": "Due retries in due order from todo_retry_due, then "
    "updated by primary key, as the reaper does.",
    "create with a new idempotency key": "The insert's conflict arbiter is todo_runnable_idempotency_key; "
    "nothing reads the table.",
    "create with a key a runnable todo holds (conflict)": "The arbiter finds the runnable holder in the "
    "partial unique index; nothing is inserted.",
    "the holder of a key (after a conflicting create)": "One lookup in the partial unique index.",
    "dead-letters of one queue, newest first (admin filter)": "Served from a partial index of failed rows, "
    "newest first. Alone, todo_dead_letters (queue, updated_at) reads 50 entries for 50 rows; since migration "
    "0004 the planner may prefer todo_failed_recent (dead-letters only since migration 0042, so it filters "
    "nothing): bounded by the dead-letters, not by the table.",
    "dead-letters, all queues, API order (dead=true)": "Every dead-letter, then a top-N sort by created_at "
    "(or, since migration 0004, todo_admin_state_recent read backwards for state = 'failed'): bounded by "
    "the failed rows, not by the table. CHECK since the million scheduled todos were added to this mix: "
    "they are newer than every dead-letter, and the planner, expecting dead-letters evenly spread, walks "
    "todo_admin_recent backwards through them (seconds). Any backlog of a million newer todos does the same "
    "(pending ones too): the API's dead=true listing should order by an index it filters on.",
    "dead-letter count per queue": "One pass over a partial index of failed rows (todo_dead_letters, or "
    "todo_failed_recent since migration 0004), no table scan.",
}


@dataclass
class Plan:
    title: str
    statement: str  # the name in todos/sql/, or the ORM call
    expect: str  # the index we rely on
    reading: str = ""
    text: str = ""


def one(query: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cur:
        cur.execute(query, params or [])
        return cur.fetchone()


def explain(statement: str, params: dict[str, Any], setup: str = "") -> str:
    with transaction.atomic():
        with connection.cursor() as cur:
            if setup:  # rolled back with the rest
                cur.execute(setup)
                cur.execute("ANALYZE todos_todo")
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) " + statement, params)
            text = "\n".join(row[0] for row in cur.fetchall())
        transaction.set_rollback(True)
    return text


def read(plan: Plan) -> str:
    """A one-line reading: which indexes, whether anything scanned the table, rows and buffers touched."""
    text = plan.text
    indexes = set(re.findall(r"(?:Index(?: Only)? Scan(?: Backward)? using|Bitmap Index Scan on) (\w+)", text))
    indexes |= {f"{name} (arbiter)" for name in re.findall(r"Conflict Arbiter Indexes: (\w+)", text)}
    indexes = sorted(indexes)
    seq = re.findall(r"Seq Scan on (\w+)", text)
    seq_todos = [s for s in seq if s == "todos_todo"]
    buffers = re.search(r"Buffers: shared ([^\n]+)", text)
    ms = re.search(r"Execution Time: ([\d.]+) ms", text)
    rows = sum(int(n) for n in re.findall(r"actual rows=(\d+)", text))
    parts = [
        f"indexes: {', '.join(indexes) or 'none'}",
        "SEQ SCAN of todos_todo" if seq_todos else "no scan of todos_todo",
        f"rows through all nodes: {rows:,}",
        f"buffers: {buffers.group(1) if buffers else '?'}",
        f"{ms.group(1) if ms else '?'} ms",
    ]
    wanted = plan.expect.split("|")  # alternatives the plan may equally use
    ok = any(i.startswith(w) for i in indexes for w in wanted) if plan.expect else not seq_todos
    return ("OK" if ok else "CHECK") + " - " + "; ".join(parts)


# github.push made fair (in the rolled-back transaction of its plans): its pending todos over 1,000 keys.
FAIR_QUEUE = (
    "UPDATE todos_todo SET fair_key = 'k' || (abs(hashtext(id)) % 1000) WHERE queue = 'github.push' "
    "AND state = 'pending'; UPDATE todos_queue SET fair = true, max_claimed_per_key = 2 "
    "WHERE name = 'github.push'; INSERT INTO todos_fairkey (queue, key, vtime) "
    "SELECT DISTINCT queue, fair_key, 0 FROM todos_todo WHERE queue = 'github.push' AND state = 'pending'; "
    "ANALYZE todos_fairkey"
)


def plans() -> list[Plan]:
    scopes_all = ["%"]
    lease = 300.0
    claim = {"scopes": scopes_all, "agent": "bench", "owner": "bench", "lease_seconds": lease, "reserve": 0}
    pending_id = one("SELECT id FROM todos_todo WHERE state = 'pending' AND queue = 'email.send' LIMIT 1")[0]
    live_id, live_lease = one("SELECT id, lease_id FROM todos_todo WHERE state = 'claimed' AND lease_id LIKE 'ls_1%%'")
    failing = {"backoff_base": 10.0, "backoff_cap": 3600.0, "retry_in": None, "error": "boom"}
    receipt = {"id": live_id, "lease_id": live_lease, "agent": "worker", "visible": scopes_all}
    existing_key = one("SELECT idempotency_key FROM todos_todo WHERE state = 'pending' AND queue = 'github.push'")[0]

    # CREATE_MANY with one item, as queue.create runs it: a JSON array of one object, defaults left out.
    def create(**item: Any) -> dict[str, Any]:
        row = {"id": "td_explain", "queue": "github.push", "source": "github", "kind": "event", "title": "new", **item}
        return {"items": json.dumps([row]), "max_attempts": 5, "on_dependency_failure": "cancel"}

    later = one("SELECT id FROM todos_todo WHERE state = 'scheduled' AND run_at > now() + interval '1 hour' LIMIT 1")
    crashed_fleet = """UPDATE todos_todo SET state = 'claimed', attempt = 1, owner = 'gone', lease_id = 'ls_x',
        lease_expires_at = now() - interval '1 minute' WHERE state = 'pending' AND queue = 'github.pull_request'"""
    out: list[tuple[Plan, str, dict[str, Any]] | tuple[Plan, str, dict[str, Any], str]] = [
        (
            Plan("claim_next, one queue, limit 1", "sql.CLAIM_NEXT", "todo_pending_claim_scan"),
            sql.CLAIM_NEXT,
            {**claim, "wanted": ["github.push"], "limit": 1},
        ),
        (
            Plan("claim_next, all six queues (scope '*'), limit 1", "sql.CLAIM_NEXT", "todo_pending_claim_scan"),
            sql.CLAIM_NEXT,
            {**claim, "wanted": scopes_all, "limit": 1},
        ),
        (
            Plan("claim_next, two queues, batch of 10", "sql.CLAIM_NEXT", "todo_pending_claim_scan"),
            sql.CLAIM_NEXT,
            {**claim, "wanted": ["github.push", "stripe.charge"], "limit": 10},
        ),
        (
            Plan(
                "claim_next, all queues, limit 1, with 15,500 lapsed leases (a crashed fleet, before a sweep)",
                "sql.CLAIM_NEXT",
                "todo_claimed_lease_expiry|todo_live_leases",
            ),
            sql.CLAIM_NEXT,
            {**claim, "wanted": scopes_all, "limit": 1},
            crashed_fleet,
        ),
        (
            Plan(
                "claim_next, one queue with max_claimed and a rate limit, limit 10",
                "sql.CLAIM_NEXT_LIMITED",
                "todo_pending_claim_scan",
            ),
            # queue.claim_next runs it after CLAIM_NEXT's row of NULLs marked 'limited' (issue 32)
            sql.CLAIM_NEXT_LIMITED,
            {**claim, "wanted": ["github.push"], "limit": 10},
            "UPDATE todos_queue SET max_claimed = 1000, rate_per_second = 100, rate_burst = 100, tokens = 100, "
            "refilled_at = now() WHERE name = 'github.push'",
        ),
        (
            Plan(
                "claim_next, one fair queue, 1,000 keys, max_claimed_per_key 2, limit 10",
                "sql.CLAIM_NEXT_FAIR",
                "todo_fair_pending",
            ),
            sql.CLAIM_NEXT_FAIR,
            {**claim, "wanted": ["github.push"], "limit": 10},
            FAIR_QUEUE,
        ),
        (
            Plan(
                "claim_next's plain statement on a fair queue (it takes nothing and says so)",
                "sql.CLAIM_NEXT",
                "",
            ),
            sql.CLAIM_NEXT,
            {**claim, "wanted": ["github.push"], "limit": 10},
            FAIR_QUEUE,
        ),
        (
            Plan("claim (one id)", "sql.CLAIM_ONE", "todos_todo_pkey"),
            sql.CLAIM_ONE,
            {**claim, "id": pending_id, "limit": 1},
        ),
        (
            Plan("cancel (one id)", "sql.CANCEL", "todos_todo_pkey"),
            sql.CANCEL,
            {"ids": [pending_id], "operator": "ops", "reason": "", "visible": scopes_all},
        ),
        (
            Plan(
                "claim_next, one queue, limit 1, nothing pending (only future scheduled todos)",
                "sql.CLAIM_NEXT",
                "todo_scheduled_due",
            ),
            sql.CLAIM_NEXT,
            {**claim, "wanted": ["ci.build"], "limit": 1},
        ),
        (
            Plan("claim (one id) of a todo scheduled for later", "sql.CLAIM_ONE", "todos_todo_pkey"),
            sql.CLAIM_ONE,
            {**claim, "id": later[0] if later else pending_id, "limit": 1},
        ),
        (
            Plan("promote_due_scheduled (reaper), batch 500", "sql.PROMOTE_DUE_SCHEDULED", "todo_scheduled_due"),
            sql.PROMOTE_DUE_SCHEDULED,
            {"batch": 500},
        ),
        (
            Plan(
                "seconds_until_claimable (a long-poll's next wake)",
                "sql.SECONDS_UNTIL_CLAIMABLE",
                "todo_scheduled_due",
            ),
            sql.SECONDS_UNTIL_CLAIMABLE,
            {"scopes": scopes_all, "wanted": scopes_all, "agent": "bench"},
        ),
        (
            Plan("queue_stats, one queue (an agent's GET /api/v1/queues/)", "sql.QUEUE_STATS", "todo_retry_queue_due"),
            sql.QUEUE_STATS,
            {"visible": ["email.send"]},
        ),
        (
            Plan("create scheduled for later", "sql.CREATE_MANY", "todo_runnable_idempotency_key"),
            sql.CREATE_MANY,
            create(idempotency_key="scheduled-key", delay=3600.0),
        ),
        (
            Plan("heartbeat", "sql.HEARTBEAT", "todos_todo_pkey"),
            sql.HEARTBEAT,
            {**receipt, "lease_seconds": lease, "progress": None, "checkpoint": None},
        ),
        (Plan("complete", "sql.COMPLETE", "todos_todo_pkey"), sql.COMPLETE, {**receipt, "result": Jsonb({"ok": 1})}),
        (Plan("fail", "sql.FAIL", "todos_todo_pkey"), sql.FAIL, {**receipt, **failing}),
        (
            Plan("requeue_lapsed (reaper), batch 500", "sql.REQUEUE_LAPSED", "todo_claimed_lease_expiry"),
            sql.REQUEUE_LAPSED,
            {"batch": 500},
        ),
        (
            Plan("promote_due_retries (retry scheduler), batch 500", "sql.PROMOTE_DUE_RETRIES", "todo_retry_due"),
            sql.PROMOTE_DUE_RETRIES,
            {"batch": 500},
        ),
        (
            Plan("create with a new idempotency key", "sql.CREATE_MANY", "todo_runnable_idempotency_key"),
            sql.CREATE_MANY,
            create(idempotency_key="brand-new-key"),
        ),
        (
            Plan(
                "create with a key a runnable todo holds (conflict)", "sql.CREATE_MANY", "todo_runnable_idempotency_key"
            ),
            sql.CREATE_MANY,
            create(idempotency_key=existing_key),
        ),
        (
            Plan("the holder of a key (after a conflicting create)", "sql.RUNNABLE_BY_KEYS", ""),
            sql.RUNNABLE_BY_KEYS,
            {"queues": ["github.push"], "keys": [existing_key]},
        ),
    ]
    result = []
    for plan, statement, params, *setup in out:
        plan.text = explain(statement, params, *setup)
        result.append(plan)
    # Dead-letter triage through the ORM, as the admin and the API filter them.
    orm = [
        (
            Plan(
                "dead-letters of one queue, newest first (admin filter)",
                "Todo.objects.dead_lettered().filter(queue=...).order_by('-updated_at')[:50]",
                "todo_dead_letters|todo_failed_recent",
            ),
            Todo.objects.dead_lettered().filter(queue="github.push").order_by("-updated_at")[:50],
        ),
        (
            Plan(
                "dead-letters, all queues, API order (dead=true)",
                "Todo.objects.dead_lettered().order_by('-created_at', '-id')[:51]",
                "todo_dead_letters|todo_failed_recent|todo_admin_state_recent",
            ),
            Todo.objects.dead_lettered().order_by("-created_at", "-id")[:51],
        ),
        (
            Plan(
                "dead-letter count per queue",
                "Todo.objects.dead_lettered().values('queue').annotate(n=Count('id'))",
                "todo_dead_letters|todo_failed_recent",
            ),
            Todo.objects.dead_lettered().values("queue").annotate(n=Count("id")),
        ),
    ]
    for plan, qs in orm:
        plan.text = qs.explain(analyze=True, buffers=True, timing=False)
        result.append(plan)
    for plan in result:
        plan.reading = read(plan)
    return result


def write(result: list[Plan]) -> None:
    version = one("SHOW server_version")[0]
    with connection.cursor() as cur:
        cur.execute("SELECT state, count(*) FROM todos_todo GROUP BY state")
        counts = dict(cur.fetchall())
    lines = [
        "# Query plans on 1M todos",
        "",
        "Made by `bench/claim/explain_plans.py` (`.venv/bin/python bench/claim/explain_plans.py`; it seeds its",
        f"own scratch database on the embedded server). PostgreSQL {version}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC,",
        "on a 2-core machine shared with other work (timings are indicative; the plan shapes and buffer counts are",
        "what matter).",
        "",
        f"Rows by state: {', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))}. Pending per queue: "
        + ", ".join(f"{q} {n:,}" for q, n in PENDING.items())
        + f"; of the claimed, {MIX['claimed_lapsed']} have lapsed leases; of the failed, {MIX['retry_waiting']:,}"
        f" wait for a retry, {MIX['retry_due']} were due when seeded (more fall due as time passes) and"
        f" {MIX['dead']:,} are dead-letters. Scheduled: {counts.get('scheduled', 0):,} (of them"
        f" {SCHEDULED_DUE} due but not yet promoted), in the four busy queues.",
        "",
        "Each reading is followed by what was measured: the indexes the plan used, whether it scanned the",
        "todos table, the rows that passed through all plan nodes (loops not multiplied), the shared buffers",
        "touched, and the time. OK means the plan used the index the statement was written for (models.py",
        "names it beside its query).",
        "",
        "## What these plans decided",
        "",
        "- Scheduling (migrations 0011-0012): claims order by (priority, run_at), so the pending index is",
        "  `(queue, priority, run_at NULLS FIRST) WHERE pending`; due scheduled todos come from",
        "  `todo_scheduled_due (queue, run_at) WHERE scheduled`, one range `run_at <= now()` per queue that",
        "  ends at the first future row. With a million todos scheduled for later in the claimed queues, no",
        "  claim, reaper sweep or long-poll wake reads them (the rows and buffers of each plan below); nor the",
        "  Procrastinate trap of filtering scheduled_at after the index, which re-walks every future job.",
        "- Migration 0007 orders the pending index NULLS FIRST and CLAIM_NEXT the same way: on a table whose",
        "  pending backlog outnumbers its history the planner could otherwise serve the claim's order from the",
        "  admin's plain `created_at` index and walk every done row at its head (10,000 buffers for one claim",
        "  in a soak). No other index yields that order; `todos/tests/test_claim_plan.py` pins it.",
        "- Every statement in todos/sql/ reaches its rows through an index; none scans the table.",
        "- The claim scan is one descent of `todo_pending_claim_scan` per queue, whatever the number of queues",
        "  (the LATERAL join over `todos_queue`), so 50k pending rows and 940k done rows cost it nothing.",
        "- Django's extra `varchar_pattern_ops` indexes on `id` and `event_id` (`*_like`, for LIKE 'prefix%')",
        "  served nothing, yet every transition is a non-HOT update that wrote into them; the id one was 74 MB,",
        "  as large as the primary key. Migration 0005 drops both; `todos/tests/test_schema.py` pins the set.",
        "- Main's migration 0004 added eight indexes for the admin and the dashboard. Queue statements keep",
        "  their own indexes; the dead-letter queries may now be served by the admin's (still bounded by the",
        '  failed rows). Every index costs each transition a write: see docs/benchmarks.md, "Indexes cost',
        '  throughput".',
        "- The lapsed branch is estimated at one row; with hundreds of lapsed leases the planner hashes and",
        "  sorts them all on every claim (sub-millisecond at these counts). The reaper keeps them few; if an",
        "  outage leaves tens of thousands, claims slow until it has swept.",
        "- Migration 0019: due retries, the long-poll's next due retry and queue_stats' retry count read",
        "  `todo_retry_queue_due (queue, next_retry_at NULLS FIRST)`, one descent per queue; across queues in",
        "  due order the claim's generic plan once read and sorted every queue's due retries.",
        "- Prepared, CLAIM_NEXT must keep custom plans (PostgreSQL's default choice here): forced generic plans",
        "  (`plan_cache_mode = force_generic_plan`) made the raw claim+complete loop of",
        "  `make bench` ten times slower (784 -> 77 jobs/s, one worker).",
        "",
    ]
    for plan in result:
        lines += [
            f"## {plan.title}",
            "",
            f"`{plan.statement}` (expects `{plan.expect or 'no table scan'}`)",
            "",
            f"**Reading:** {NOTES.get(plan.title, '')}",
            "",
            f"Measured: {plan.reading}",
            "",
            "```",
            plan.text,
            "```",
            "",
        ]
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reseed", action="store_true", help="truncate and seed again")
    parser.add_argument("--scheduled", type=int, default=SCHEDULED, help="todos scheduled for later beside the mix")
    args = parser.parse_args()
    have = one("SELECT count(*) FROM todos_todo")[0]
    want = TOTAL + args.scheduled + (SCHEDULED_DUE if args.scheduled else 0)
    if args.reseed or have != want:
        seed(args.scheduled)
    result = plans()
    for plan in result:
        print(f"{plan.title}: {plan.reading}")
    write(result)


if __name__ == "__main__":
    main()
