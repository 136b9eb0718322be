"""PostgreSQL's CPU per claim + complete (issue 32, item 1): wave 1's statements, today's, and today's on queues
that use each feature, in one run.

    .venv/bin/python bench/claim/pg_cpu.py                                   # 4 and 16 clients, every mode
    .venv/bin/python bench/claim/pg_cpu.py --clients 4 --cycles 400 --runs 1 # a short look
    .venv/bin/python bench/claim/pg_cpu.py --modes plain --before a904ce4    # before/after a change, one run
    .venv/bin/python bench/claim/pg_cpu.py --explain                         # plans of today's plain pair

CPU accounting, as bench/peers3 did for the peers: the PostgreSQL server's processes' utime + stime, read from
/proc/<pid>/stat (the postmaster's own and its reaped children's, cutime + cstime, plus every live child's),
before and after a fixed number of claim + complete cycles, divided by the cycles. Every backend, the
autovacuum the cycles cause and the WAL writer are counted; the clients (pgbench, Python) are not.

Each row seeds its queue (same plain backlog, VACUUM ANALYZE, CHECKPOINT), then pgbench runs
``--cycles`` cycles in all (-t per client, -M prepared) of the claim + complete pair as queue.py runs it for
that queue. The rows run in rounds, every row once per round, so a busy minute on a shared machine lands on
one run of each; each figure is the median of ``--runs``. Modes (today's schema unless named):
  * wave1: wave 1's CLAIM_NEXT and COMPLETE (commit b2b61b4) on wave 1's own schema (bench/claim/claim_cost.py)
  * plain: today's, on a plain queue: the target is <= 1.0 ms at 4 and 16 clients
  * neighbours: the same plain queue, while other queues hold 10,000 todos each of fair share (1,000 keys),
    max_claimed, scheduled for later, dead-letters and retries due later: what a plain queue must not pay for
  * max_claimed, rate: the queue's controls set, too high to bind (CLAIM_NEXT, then CLAIM_NEXT_LIMITED)
  * scheduled: 10,000 todos scheduled a day ahead beside the backlog
  * fair: fair share over 10 keys (CLAIM_NEXT, then CLAIM_NEXT_FAIR, as queue.claim_next runs them)
  * limits: the queue names a limit too high to bind (CLAIM_NEXT, then CLAIM_NEXT_FAIR)
  * deps: every todo has a dependent (has_dependents: the complete settles one edge each)
  * tree: every todo is a child of one root whose budget is open
  * inproc: queue.claim_next + queue.complete in Django processes on a plain queue (what a worker pays)
``--before COMMIT`` adds that commit's CLAIM_NEXT and COMPLETE on today's schema (plain, max_claimed and rate
queues, those of them in ``--modes``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h
from bench.claim.claim_cost import (
    Version,
    params,
    script,
    seed,
    statements_at,
    today_version,
    wave1_version,
)
from bench.compare.compare_workers import QUEUE, _render, _sql_literal, inproc_worker, make_agent, run_processes

TICK = os.sysconf("SC_CLK_TCK")
MODES = ("wave1", "plain", "neighbours", "max_claimed", "rate", "scheduled", "fair", "limits", "deps", "tree", "inproc")


def postmaster_pid(server: h.PgServer) -> int:
    import psycopg

    with psycopg.connect(server.url) as conn:
        data_dir = str(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    return int(Path(data_dir, "postmaster.pid").read_text().split()[0])


def _stat(pid: int) -> tuple[int, list[int]]:
    """(ppid, [utime, stime, cutime, cstime]) in clock ticks."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return int(fields[1]), [int(x) for x in fields[11:15]]


def server_cpu(pm: int) -> float:
    """Seconds of CPU the server has used: the postmaster's, its reaped children's, its live children's."""
    total = sum(_stat(pm)[1])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == pm:
            continue
        try:
            ppid, times = _stat(int(entry.name))
        except (OSError, ValueError):
            continue  # exited meanwhile: its time is in the postmaster's cutime once reaped
        if ppid == pm:
            total += sum(times)
    return total / TICK


def table_stats(url: str) -> tuple[int, int, int]:
    """(updates, HOT updates, WAL LSN) now."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_stat_user_tables "
            "WHERE relname = 'todos_todo'"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])


def seed_mode(v: Version, backlog: int, mode: str) -> None:
    """The queue of ``mode``: claim_cost's seeds, and the features it has none for."""
    import psycopg

    variant = {"fair": "fair:10"}.get(mode, mode if mode in ("max_claimed", "rate", "scheduled") else "plain")
    seed(v.url, backlog, v.today, variant)
    if not v.today:
        return
    with psycopg.connect(v.url, autocommit=True) as conn:
        conn.execute("UPDATE todos_queue SET limits = NULL WHERE name = %s", [QUEUE])
        conn.execute("DELETE FROM todos_limit WHERE name = 'bench-limit'")
        if mode == "limits":
            conn.execute(
                "INSERT INTO todos_limit (name, created_at, updated_at, max_claimed, park_reason) "
                "VALUES ('bench-limit', now(), now(), 1000000, '')"
            )
            conn.execute("UPDATE todos_queue SET limits = ARRAY['bench-limit'] WHERE name = %s", [QUEUE])
        elif mode == "deps":
            conn.execute("UPDATE todos_todo SET has_dependents = true WHERE queue = %s", [QUEUE])
        elif mode == "tree":
            conn.execute(
                """INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,
                    errors, created_at, updated_at, run_at, priority, fair_key, budget)
                VALUES ('td_benchroot', 'bench-root', 'bench', 'root', 'root', '{}', 'pending', 0, 5, '[]', now(),
                    now(), now(), 0, '', '{"tokens": 1000000000}')"""
            )
            conn.execute(
                # budget_exhausted false: marked as in a budgeted tree, as a create under a parent marks it
                "UPDATE todos_todo SET parent_id = 'td_benchroot', root_id = 'td_benchroot', depth = 1, "
                "budget_exhausted = false WHERE queue = %s",
                [QUEUE],
            )
        elif mode == "neighbours":
            # Other queues use every feature; the claimer's plain queue uses none (what it must not pay for).
            conn.execute(
                """INSERT INTO todos_queue (name, created_at, fair, max_claimed) VALUES
                    ('nb-fair', now(), true, NULL), ('nb-limited', now(), false, 5) ON CONFLICT (name) DO UPDATE
                    SET fair = EXCLUDED.fair, max_claimed = EXCLUDED.max_claimed"""
            )
            conn.execute(
                """INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,
                    errors, created_at, updated_at, run_at, priority, fair_key, next_retry_at)
                SELECT 'td_nb' || q.queue || g, q.queue, 'bench', 'noop', 'neighbour', '{}', q.state, q.attempt, 5,
                    '[]', now(), now(), CASE WHEN q.state = 'scheduled' THEN now() + interval '1 day' ELSE now() END, 0,
                    CASE WHEN q.queue = 'nb-fair' THEN 'k' || (g % 1000) ELSE '' END,
                    CASE WHEN q.retry THEN now() + interval '1 day' END
                FROM generate_series(1, 10000) g CROSS JOIN (VALUES ('nb-fair', 'pending', 0, false),
                    ('nb-limited', 'pending', 0, false), ('nb-later', 'scheduled', 0, false),
                    ('nb-dead', 'failed', 5, false), ('nb-retry', 'failed', 1, true)) q(queue, state, attempt, retry)"""
            )
            conn.execute(
                "INSERT INTO todos_fairkey (queue, key, vtime) SELECT DISTINCT queue, fair_key, 0 FROM todos_todo "
                "WHERE queue = 'nb-fair' ON CONFLICT DO NOTHING"
            )
        if mode in ("deps", "tree", "neighbours"):
            conn.execute("VACUUM ANALYZE todos_todo")
            conn.execute("CHECKPOINT")


def pgbench_fixed(url: str, path: Path, clients: int, cycles: int) -> None:
    per = max(1, cycles // clients)
    cmd = [str(h.pg_bin("pgbench")), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 4))]
    done = subprocess.run([*cmd, "-t", str(per), "-f", str(path), url], capture_output=True, text=True, check=False)
    if done.returncode != 0 or "aborted" in done.stdout + done.stderr:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@dataclass
class Row:
    mode: str
    version: Version
    clients: int
    ms: list[float] = field(default_factory=list)
    hot: list[float] = field(default_factory=list)
    wal: list[float] = field(default_factory=list)


def measure(row: Row, pm: int, cycles: int, backlog: int, seconds: float) -> None:
    v = row.version
    seed_mode(v, backlog, "plain" if row.mode == "inproc" or not v.today else row.mode)
    upd0, hot0, wal0 = table_stats(v.url)
    cpu0 = server_cpu(pm)
    if row.mode == "inproc":
        done = run_processes(inproc_worker, row.clients, seconds, "claim", 1).total
    else:
        # Since issue 32 CLAIM_NEXT answers a limited queue with a row of NULLs marked 'limited', and
        # queue.claim_next runs CLAIM_NEXT_LIMITED (before, CLAIM_NEXT had the ``limited`` CTE itself).
        limited_in_plain = "limited AS MATERIALIZED" in v.claim
        fair = row.mode in ("fair", "limits") or (row.mode in ("max_claimed", "rate") and not limited_in_plain)
        if fair and row.mode in ("max_claimed", "rate") and "THEN 'limited' END" in v.claim:
            from todos import sql

            v = replace(v, fair_claim=sql.CLAIM_NEXT_LIMITED)
        pgbench_fixed(v.url, script(v, fair), row.clients, cycles)
        done = max(1, cycles // row.clients) * row.clients
    time.sleep(0.6)  # the backends' exit reaped; their statistics flushed
    cpu = server_cpu(pm) - cpu0
    upd1, hot1, wal1 = table_stats(v.url)
    import psycopg

    with psycopg.connect(v.url, autocommit=True) as conn:
        finished = conn.execute("SELECT count(*) FROM todos_todo WHERE state = 'done'").fetchone()
    if finished is None or finished[0] < done:
        print(f"    {row.mode} {v.name}: {finished} todos done of {done} cycles", flush=True)
    row.ms.append(cpu / done * 1000)
    row.hot.append((hot1 - hot0) / max(1, upd1 - upd0))
    row.wal.append((wal1 - wal0) / done)


def explain(v: Version) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the plain claim and complete, prepared as queue.py runs them (after the
    plan cache's five trials), and where the complete's writes go (the table's indexes and triggers)."""
    import psycopg

    seed_mode(v, 20_000, "plain")
    literals = {k: _sql_literal(x) for k, x in params(True).items()}
    claim = _render(v.claim, literals)
    with psycopg.connect(v.url, autocommit=True) as conn:
        for _ in range(6):  # warm: the plan the pgbench run keeps
            row = conn.execute(claim).fetchone()
        conn.execute("BEGIN")
        out = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, VERBOSE OFF, COSTS OFF) {claim}").fetchall()
        print("\n## the plain claim\n" + "\n".join(r[0] for r in out))
        conn.execute("ROLLBACK")
        cur = conn.execute(claim)
        row = cur.fetchone()
        names = [d.name for d in cur.description or []]
        assert row is not None
        complete = _render(
            v.complete,
            {
                "id": _sql_literal(row[names.index("id")]),
                "lease_id": _sql_literal(row[names.index("lease_id")]),
                **{k: _sql_literal(x) for k, x in params(False).items()},
            },
        )
        conn.execute("BEGIN")
        out = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {complete}").fetchall()
        print("\n## the complete\n" + "\n".join(r[0] for r in out))
        conn.execute("ROLLBACK")
        print("\n## todos_todo's indexes")
        for name, size, definition in conn.execute(
            "SELECT indexrelid::regclass::text, pg_size_pretty(pg_relation_size(indexrelid)), "
            "pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'todos_todo'::regclass ORDER BY 1"
        ):
            print(f"  {name} ({size}): {definition}")
        print("\n## todos_todo's triggers")
        for (definition,) in conn.execute(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'todos_todo'::regclass AND NOT tgisinternal"
        ):
            print(f"  {definition}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="4,16")
    parser.add_argument("--cycles", type=int, default=4000, help="claim + complete cycles per measurement")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--before", default="", help="commits whose CLAIM_NEXT and COMPLETE run too (plain queue)")
    parser.add_argument("--seconds", type=float, default=3.0, help="the in-process rows' run (timed, not counted)")
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    backlog = args.cycles + 2000

    server, url = h.scratch_django("pgcpu")
    make_agent()
    today = today_version(url)
    if args.explain:
        explain(today)
        return
    pm = postmaster_pid(server)
    rows: list[Row] = []
    for c in clients:
        if "wave1" in modes:
            rows.append(Row("wave1", wave1_version(server) if c == clients[0] else rows[0].version, c))
        for commit in filter(None, args.before.split(",")):
            claim, complete, fair_claim = statements_at(commit)
            before = Version(f"{commit}'s statements", url, claim, complete, True, fair_claim)
            rows += [Row(m, before, c) for m in ("plain", "max_claimed", "rate") if m in modes]
        rows += [Row(m, today, c) for m in modes if m != "wave1"]
    print(f"# {h.machine_summary(server)}; load average {open('/proc/loadavg').read().strip()}", flush=True)
    for rnd in range(args.runs):
        for row in rows:
            measure(row, pm, args.cycles, backlog, args.seconds)
            print(
                f"  round {rnd + 1}: {row.mode:12} {row.version.name:28} {row.clients:>3} {row.ms[-1]:6.3f} ms "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print(f"\nPostgreSQL CPU per claim + complete, median of {args.runs} runs of {args.cycles:,} cycles")
    print(f"load average at the end: {open('/proc/loadavg').read().strip()}")
    print(
        "| mode | statements | clients | PG CPU ms / cycle | / today's plain (a --before row: / today's same mode) "
        "| HOT share of updates | WAL bytes / cycle |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        base = next((r for r in rows if r.mode == "plain" and r.version is today and r.clients == row.clients), None)
        if row.version is not today and row.mode != "wave1":  # a --before row: against today's same mode
            same = (row.mode, row.clients)
            base = next((r for r in rows if (r.mode, r.clients) == same and r.version is today), None)
        ratio = f"{h.median(row.ms) / h.median(base.ms):.2f}" if base and base.ms else "-"
        print(
            f"| {row.mode} | {row.version.name} | {row.clients} | {h.median(row.ms):.3f} | {ratio} | "
            f"{h.median(row.hot):.2f} | {h.median(row.wal):,.0f} |"
        )


if __name__ == "__main__":
    main()
