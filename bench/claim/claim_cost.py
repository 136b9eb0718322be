"""The claim statement's cost against wave 1's, in one run (issue 19, item 4).

    .venv/bin/python bench/claim/claim_cost.py                    # pgbench and Python processes, 1/4/16 clients
    .venv/bin/python bench/claim/claim_cost.py --seconds 3 --runs 1   # a short look
    .venv/bin/python bench/claim/claim_cost.py --variants         # also limited, rate-limited, scheduled-beside queues

Wave 1's CLAIM_NEXT and COMPLETE run on wave 1's own schema: its tree (WAVE1, from git) is extracted to
bench/out/, migrated into its own scratch database, and its statements are read from its todos/sql.py.
Today's run on today's schema. Both tables are seeded with the same plain backlog before every run, and the
rows run in rounds (every row once per round), so a busy minute on a shared machine lands on one run of
each row. Each figure is the median of --runs runs, in claim+complete cycles/s:
  * pgbench: the statements alone (-M prepared, no client cost);
  * psycopg: the same two statements from Python processes (psycopg 3, prepared), as queue.py sends them;
  * today's queue.claim_next + complete in-process (Django), for reference (wave 1's Django is not run).
The ratio is today / wave 1 at the same clients; the target is 0.9 on plain queues.

    .venv/bin/python bench/claim/claim_cost.py --no-wave1 --no-inproc --fair 10,1000,10000 --before 8fe7e5c,6a65444

On a fair queue (``--fair``) today's pgbench script runs what queue.claim_next runs there: CLAIM_NEXT (which
takes nothing and answers a row of NULLs when a keyed queue is eligible), then CLAIM_NEXT_FAIR. ``--before``
takes several commits: e.g. main before fair share (8fe7e5c) and with it in one statement (6a65444);
``--before-claim`` the same with today's COMPLETE, when the complete changed too (issue 20's dependency hook).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h
from bench.compare.compare_workers import (
    AGENT,
    QUEUE,
    Shared,
    _render,
    _sql_literal,
    inproc_worker,
    make_agent,
    pgbench,
    run_processes,
)

# The last commit of wave 1 (b2b61b4: "Benchmarks re-measured after the claim-plan fix"): its claim statement is
# the one docs/benchmarks.md's wave-1 figures ran.
WAVE1 = "b2b61b4"


@dataclass
class Version:
    name: str
    url: str
    claim: str  # CLAIM_NEXT's text, %(name)s placeholders
    complete: str
    today: bool
    # Since issue 22's split: CLAIM_NEXT_FAIR, which queue.claim_next runs after CLAIM_NEXT when a keyed
    # queue is among the caller's (CLAIM_NEXT then takes nothing and answers a row of NULLs).
    fair_claim: str = ""
    scripts: dict[int, Path] = field(default_factory=dict)


def wave1_tree(commit: str = WAVE1) -> Path:
    """A commit's tree under bench/out/ (extracted once, by git archive)."""
    dest = h.out_dir() / f"tree-{commit}"
    if not (dest / "manage.py").exists():
        blob = subprocess.run(["git", "archive", commit], cwd=h.ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def wave1_version(server: h.PgServer) -> Version:
    tree = wave1_tree()
    url = server.create_database(h.scratch_db("claimcost_wave1"))
    env = h.project_env(url, PYTHONPATH=str(tree))
    subprocess.run([h.PYTHON, "-m", "django", "migrate", "--noinput", "-v", "0"], cwd=tree, env=env, check=True)
    out = subprocess.run(
        [h.PYTHON, "-c", "import json; from todos import sql; print(json.dumps([sql.CLAIM_NEXT, sql.COMPLETE]))"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    claim, complete = json.loads(out)
    return Version(f"wave 1 ({WAVE1})", url, claim, complete, today=False)


def statements_at(commit: str) -> tuple[str, str, str]:
    """CLAIM_NEXT, COMPLETE and CLAIM_NEXT_FAIR ("" before fair share) as todos.sql had them at ``commit`` (a
    module then, a package now)."""
    tree = wave1_tree(commit)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [
            h.PYTHON,
            "-c",
            "import json; from todos import sql; "
            "print(json.dumps([sql.CLAIM_NEXT, sql.COMPLETE, getattr(sql, 'CLAIM_NEXT_FAIR', '')]))",
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    claim, complete, fair_claim = json.loads(out)
    return claim, complete, fair_claim


def today_version(url: str) -> Version:
    from todos import queue, sql  # queue too: the forked workers then run the code this run started with

    assert queue

    return Version("today", url, sql.CLAIM_NEXT, sql.COMPLETE, today=True, fair_claim=sql.CLAIM_NEXT_FAIR)


def params(claim: bool) -> dict[str, Any]:
    if claim:
        return {"scopes": ["%"], "wanted": [QUEUE], "agent": AGENT, "owner": f"{AGENT}/w", "limit": 1,
                "lease_seconds": 300.0, "reserve": 0}  # fmt: skip
    return {"agent": AGENT, "visible": ["%"], "result": None}


def script(v: Version, fair: bool = False) -> Path:
    """The pgbench script: claim, \\gset, complete. On a fair queue (``fair``) a version with a fair_claim
    runs both claims, as queue.claim_next does: CLAIM_NEXT (its row of NULLs discarded), then CLAIM_NEXT_FAIR."""
    literals = {k: _sql_literal(x) for k, x in params(True).items()}
    claim = _render(v.claim, literals)
    if fair and v.fair_claim:
        claim = f"{claim};\n{_render(v.fair_claim, literals)}"
    complete = _render(
        v.complete, {"id": ":id", "lease_id": ":lease_id", **{k: _sql_literal(x) for k, x in params(False).items()}}
    )
    name = "".join(ch if ch.isalnum() else "_" for ch in v.name)
    path = h.out_dir() / f"claim_cost_{name}{'_fair' if fair else ''}.sql"
    path.write_text(f"{claim}\n\\gset\n{complete};\n")
    return path


# Columns every version's table has; today's run_at and priority have no database default.
def seed(url: str, n: int, today: bool, variant: str = "plain") -> None:
    import psycopg

    keys = int(variant.split(":")[1]) if variant.startswith("fair:") else 0
    extra_cols = ", run_at, priority, fair_key" if today else ""
    # A fair queue's todos take their keys in turn (g mod keys), so every key stays active to the end.
    extra_vals = (", c.at, 0, " + (f"'k' || (g %% {keys})" if keys else "''")) if today else ""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todos_todo")
        conn.execute("INSERT INTO todos_queue (name, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", [QUEUE])
        if today:  # the seed goes in plain (no key registered row by row); a fair variant registers them at once
            conn.execute("UPDATE todos_queue SET fair = false, max_claimed_per_key = NULL WHERE name = %s", [QUEUE])
            conn.execute("DELETE FROM todos_fairkey")
        conn.execute(
            f"""INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                created_at, updated_at{extra_cols})
            SELECT 'td_' || md5(g::text || random()::text), %s, 'bench', 'noop', 'no-op', '{{}}'::jsonb, 'pending',
                0, 5,
                '[]'::jsonb, c.at, now(){extra_vals}
            FROM generate_series(1, %s) g
            CROSS JOIN LATERAL (SELECT now() - interval '1 hour' + g * interval '1 microsecond' AS at) c""",
            [QUEUE, n],
        )
        if today:
            controls = {
                "plain": "paused = false, max_claimed = NULL, rate_per_second = NULL, rate_burst = NULL, "
                "tokens = NULL, refilled_at = NULL",
                "max_claimed": "max_claimed = 1000000",
                "rate": "rate_per_second = 1000000, rate_burst = 1000000, tokens = 1000000, refilled_at = now()",
            }
            conn.execute(f"UPDATE todos_queue SET {controls.get(variant, controls['plain'])} WHERE name = %s", [QUEUE])
            if variant.startswith("fair:"):
                conn.execute("UPDATE todos_queue SET fair = true, fair_round = 0 WHERE name = %s", [QUEUE])
                conn.execute("DELETE FROM todos_fairkey WHERE queue = %s", [QUEUE])
                conn.execute(
                    "INSERT INTO todos_fairkey (queue, key, vtime) SELECT DISTINCT queue, fair_key, 0 FROM todos_todo "
                    "WHERE queue = %s",
                    [QUEUE],
                )
            if variant == "scheduled":
                conn.execute(
                    """INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,
                        errors, created_at, updated_at, run_at, priority)
                    SELECT 'td_s' || md5(g::text || random()::text), %s, 'bench', 'noop', 'later', '{}'::jsonb,
                        'scheduled', 0, 5, '[]'::jsonb, now(), now(),
                        now() + interval '1 day' + g * interval '1 second', 0
                    FROM generate_series(1, 10000) g""",
                    [QUEUE],
                )
        conn.execute("VACUUM ANALYZE todos_todo")
        conn.execute("CHECKPOINT")


def psycopg_worker(slot: int, sh: Shared, url: str, claim_sql: str, complete_sql: str, fair_sql: str = "") -> None:
    """Claim and complete as queue.py sends them: bound parameters, prepared once per connection (so the
    figures include what the plan cache does: planning each call, or once). With ``fair_sql``, a claim that
    answers the row of NULLs is followed by the fair one, as queue.claim_next does."""
    import psycopg

    with sh.slot(slot), psycopg.connect(url, autocommit=True) as conn:
        claim = {**params(True), "owner": f"{AGENT}/psycopg{slot}"}
        sh.barrier.wait(120)
        end, n = sh.deadline.value, 0
        while time.monotonic() < end:
            cur = conn.execute(claim_sql, claim, prepare=True)
            row = cur.fetchone()
            names = [d.name for d in cur.description or []]
            if row is not None and row[names.index("id")] is None and fair_sql:
                cur = conn.execute(fair_sql, claim, prepare=True)
                row = cur.fetchone()
            if row is None:
                break
            receipt = {"id": row[names.index("id")], "lease_id": row[names.index("lease_id")], **params(False)}
            conn.execute(complete_sql, receipt, prepare=True)
            n += 1
            sh.counts[slot] = n


def latency(versions: list[Version], samples: int, backlog: int) -> dict[str, tuple[float, float, float, str]]:
    """One client, one connection per version, the versions taking turns statement by statement (the
    machine's load then falls on both alike): median claim and complete times in ms, and whether
    PostgreSQL kept a generic plan or re-planned each claim."""
    import psycopg

    conns = {}
    for v in versions:
        seed(v.url, backlog, v.today)
        conns[v.name] = psycopg.connect(v.url, autocommit=True)
    claims: dict[str, list[float]] = {v.name: [] for v in versions}
    completes: dict[str, list[float]] = {v.name: [] for v in versions}
    wal: dict[str, int] = {v.name: 0 for v in versions}
    lsn = "SELECT pg_current_wal_insert_lsn()"
    try:
        for _ in range(samples):
            for v in versions:
                conn = conns[v.name]
                before = conn.execute(lsn).fetchone()
                t0 = time.perf_counter()
                cur = conn.execute(v.claim, params(True), prepare=True)
                row = cur.fetchone()
                t1 = time.perf_counter()
                assert row is not None, "the backlog ran dry"
                names = [d.name for d in cur.description or []]
                receipt = {"id": row[names.index("id")], "lease_id": row[names.index("lease_id")], **params(False)}
                conn.execute(v.complete, receipt, prepare=True)
                claims[v.name].append(t1 - t0)
                completes[v.name].append(time.perf_counter() - t1)
                # Bytes of WAL this pair wrote (the versions take turns, so no other writer is counted but the
                # autovacuum and checkpointer of a quiet database): unlike a time, the load does not move it.
                after = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", before).fetchone()
                wal[v.name] += int(after[0]) if after else 0
        out = {}
        for v in versions:
            plans = (
                conns[v.name]
                .execute(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement ILIKE '%%WITH queues%%'"
                )
                .fetchone()
            )
            plan = "generic" if plans and plans[0] > plans[1] else "re-planned each call"
            out[v.name] = (
                h.median(claims[v.name]) * 1000,
                h.median(completes[v.name]) * 1000,
                wal[v.name] / samples,
                plan,
            )
        return out
    finally:
        for conn in conns.values():
            conn.close()


@dataclass
class Row:
    what: str
    version: str
    clients: int
    measure: Callable[[], float]
    runs: list[float] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=60_000)
    parser.add_argument("--variants", action="store_true", help="also today's statement on controlled queues")
    parser.add_argument(
        "--fair", default="", help="active keys, e.g. 10,1000,10000: today's statement on a fair queue (issue 22)"
    )
    parser.add_argument("--no-inproc", action="store_true")
    parser.add_argument(
        "--no-pgbench",
        action="store_true",
        help="psycopg rows only (bound parameters, as queue.py sends them: pgbench's literals are planned once)",
    )
    parser.add_argument("--no-wave1", action="store_true", help="today's rows only (with --fair: fair against plain)")
    parser.add_argument(
        "--before",
        default="",
        help="also these commits' (comma-separated) CLAIM_NEXT and COMPLETE on today's schema (before/after a "
        "change, one run)",
    )
    parser.add_argument(
        "--before-claim",
        default="",
        help="also these commits' CLAIM_NEXT with today's COMPLETE on today's schema: the claim's cost alone, when "
        "the complete changed too",
    )
    parser.add_argument(
        "--without-index",
        default="",
        help="also today's statements on a copy of today's schema without this index (what one index costs)",
    )
    parser.add_argument(
        "--synchronous-commit",
        default="",
        help="e.g. off: every connection of the run sets it, so the figures are the statements' work and not the "
        "disk's flush (on a slow or shared disk, one flush per commit hides what the statements cost)",
    )
    parser.add_argument("--samples", type=int, default=1000, help="claim+complete pairs per version, one client")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    if args.synchronous_commit:
        # libpq reads PGOPTIONS: pgbench and every psycopg connection of this process and its children.
        os.environ["PGOPTIONS"] = f"-c synchronous_commit={args.synchronous_commit}"

    server, today_url = h.scratch_django("claimcost")
    make_agent()
    today = today_version(today_url)
    versions = [] if args.no_wave1 else [wave1_version(server)]
    versions.append(today)
    for commit in filter(None, args.before.split(",")):
        claim, complete, fair_claim = statements_at(commit)
        versions.append(Version(f"today's schema, {commit}'s statements", today_url, claim, complete, True, fair_claim))
    for commit in filter(None, args.before_claim.split(",")):
        claim, _, _ = statements_at(commit)
        versions.append(Version(f"{commit}'s claim, today's complete", today_url, claim, today.complete, True))
    if args.without_index:
        url = server.create_database(h.scratch_db("claimcost_without"))
        h.migrate(url)
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP INDEX "{args.without_index}"')
        versions.append(Version(f"today without {args.without_index}", url, today.claim, today.complete, True))
    print(
        f"# {h.machine_summary(server)}; load average {os.getloadavg()[0]:.1f}; "
        f"synchronous_commit {args.synchronous_commit or 'as configured'}",
        flush=True,
    )

    # With --fair, a --before commit that has fair share runs its fair claim too: the fair rows before/after.
    fair_versions = [(today, "")] + [(v, f"{v.name}, ") for v in versions if v.fair_claim and v is not today]

    def pg(v: Version, c: int, variant: str = "plain") -> Callable[[], float]:
        def run() -> float:
            seed(v.url, args.backlog, v.today, variant)
            # Since issue 32 a limited queue's claim is CLAIM_NEXT (its row of NULLs), then CLAIM_NEXT_LIMITED.
            fair, run = variant.startswith("fair:"), v
            if variant in ("max_claimed", "rate") and v.today:
                from todos import sql

                fair, run = True, replace(v, fair_claim=sql.CLAIM_NEXT_LIMITED)
            tps, warn = pgbench(v.url, script(run, fair), c, args.seconds)
            if warn:
                print(f"    {v.name} {c}: {warn}", flush=True)
            return tps

        return run

    def py(v: Version, c: int, variant: str = "plain") -> Callable[[], float]:
        def run() -> float:
            seed(v.url, args.backlog, v.today, variant)
            fair_sql = v.fair_claim if variant.startswith("fair:") else ""
            return run_processes(psycopg_worker, c, args.seconds, v.url, v.claim, v.complete, fair_sql).rate

        return run

    def inproc(c: int) -> Callable[[], float]:
        def run() -> float:
            seed(today.url, args.backlog, True)
            return run_processes(inproc_worker, c, args.seconds, "claim", 1).rate

        return run

    # The versions of today's schema share one table: the backlog covers all their claims.
    lat = latency(versions, args.samples, args.samples * len(versions) + 1000) if len(versions) > 1 else {}
    rows: list[Row] = []
    for what, measure in (("pgbench", pg), ("psycopg", py)):
        if what == "pgbench" and args.no_pgbench:
            continue
        for c in clients:
            rows += [Row(what, v.name, c, measure(v, c)) for v in versions]
            if args.fair:
                rows += [
                    Row(what, f"{prefix}fair, {k} keys", c, measure(v, c, f"fair:{k}"))
                    for v, prefix in fair_versions
                    for k in args.fair.split(",")
                ]
    if not args.no_inproc:
        rows += [Row("in-process (queue.py)", "today", c, inproc(c)) for c in clients]
    if args.variants:
        for variant in ("max_claimed", "rate", "scheduled"):
            rows += [Row("pgbench", f"today, {variant}", c, pg(today, c, variant)) for c in clients]
    for rnd in range(args.runs):
        for row in rows:
            row.runs.append(row.measure())
            print(
                f"  round {rnd + 1}: {row.what:22} {row.version:26} {row.clients:>3} {row.runs[-1]:8,.0f}/s", flush=True
            )

    def runs(what: str, version: str, c: int) -> list[float]:
        return next((r.runs for r in rows if (r.what, r.version, r.clients) == (what, version, c)), [])

    def ratio(what: str, base: str, version: str, c: int) -> str:
        """Medians' ratio, and the median of the rounds' ratios (each round runs the rows a few seconds apart)."""
        a, b = runs(what, base, c), runs(what, version, c)
        if not a or not b:
            return "- | -"
        paired = h.median([y / x for x, y in zip(a, b, strict=True)])
        return f"{h.median(b) / h.median(a):.2f} | {paired:.2f}"

    base = versions[0].name
    print(f"\nclaim + complete cycles/s, median of {args.runs} runs of {args.seconds:.0f} s; ratios to {base}")
    print(f"| measure | clients | version | cycles/s | / {base} | median of the rounds' ratios |")
    print("|---|---:|---|---:|---:|---:|")
    names = [v.name for v in versions] + [
        f"{prefix}fair, {k} keys" for _, prefix in fair_versions for k in args.fair.split(",") if args.fair
    ]
    for what in ("pgbench", "psycopg"):
        for c in clients:
            for name in names:
                if runs(what, name, c):
                    print(
                        f"| {what} | {c} | {name} | {h.median(runs(what, name, c)):,.0f} | "
                        f"{ratio(what, base, name, c)} |"
                    )
    if lat:
        print(f"\none client, the versions taking turns statement by statement ({args.samples} pairs each)")
        print("| version | claim ms (median) | complete ms (median) | WAL bytes per claim + complete | claim's plan |")
        print("|---|---:|---:|---:|---|")
        for name, (claim_ms, complete_ms, wal, plan) in lat.items():
            print(f"| {name} | {claim_ms:.3f} | {complete_ms:.3f} | {wal:,.0f} | {plan} |")
    if not args.no_inproc:
        print("\n| in-process (queue.py), today | clients | cycles/s |\n|---|---:|---:|")
        for c in clients:
            print(f"| | {c} | {h.median(runs('in-process (queue.py)', 'today', c)):,.0f} |")
    if args.variants:
        print("\ntoday's statement on controlled queues (pgbench), against today's plain queue")
        print("| queue | clients | cycles/s | / plain | median of the rounds' ratios |")
        print("|---|---:|---:|---:|---:|")
        for variant in ("max_claimed", "rate", "scheduled"):
            for c in clients:
                name = f"today, {variant}"
                print(
                    f"| {variant} | {c} | {h.median(runs('pgbench', name, c)):,.0f} | "
                    f"{ratio('pgbench', 'today', name, c)} |"
                )


if __name__ == "__main__":
    main()
