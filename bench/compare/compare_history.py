"""bench/compare/compare.py's measurements over time: claim latency beside growing history, and throughput
under sustained churn while autovacuum works (SPEC trap 3)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bench import harness as h
from bench.compare.compare_report import Row
from bench.compare.compare_workers import AGENT, QUEUE, inproc_worker, run_processes

if TYPE_CHECKING:
    from bench.compare.compare import Bench


def latency(bench: Bench) -> None:
    """History must not slow claims: one client's claim + complete beside 0, 100k, 1M done rows."""
    from todos import queue
    from todos.models import Agent

    print("claim latency beside done history (one client, in-process)", flush=True)
    agent = Agent.objects.get(name=AGENT)
    for done_rows in bench.cfg.history:
        h.reset_todos()
        h.seed_todos(done_rows, state="done", queue=QUEUE)
        h.seed_todos(10, queue=QUEUE)
        h.analyze()
        for _ in range(50):  # warm-up
            _cycle(queue, agent)
        times = [_cycle(queue, agent) for _ in range(bench.cfg.samples)]
        rate = len(times) / sum(times)
        bench.res.add(
            Row(
                f"claim + complete beside {done_rows:,} done rows",
                1,
                [rate],
                notes=f"p50 {h.percentile(times, 50) * 1000:.2f} ms, p99 {h.percentile(times, 99) * 1000:.2f} ms; "
                f"the claim reads {claim_buffers(bench.sb_url, agent)} buffers",
            )
        )


def claim_buffers(url: str, agent: Any) -> int:
    """Pages one CLAIM_NEXT touches, from EXPLAIN (ANALYZE, BUFFERS), rolled back: unlike a timing,
    this figure does not move with the machine's load, so it shows plainly whether history costs."""
    import psycopg

    from todos import sql

    params = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [QUEUE],
        "agent": AGENT,
        "owner": AGENT,
        "limit": 1,
        "lease_seconds": 300.0,
        "reserve": 0,  # the fair turn alone: this loop runs no CLAIM_FAIR_READY (issue 31)
    }
    with psycopg.connect(url) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.CLAIM_NEXT, params).fetchone()
        conn.rollback()
    plan = (row[0] if row else [{}])[0].get("Plan", {})
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def _cycle(queue: Any, agent: Any) -> float:
    """One timed claim + complete; then one new pending todo, untimed, so a handful stay pending."""
    started = time.perf_counter()
    todo = queue.claim_next(agent=agent, queues=[QUEUE], lease_seconds=300)[0]
    queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
    took = time.perf_counter() - started
    h.seed_todos(1, queue=QUEUE)
    return took


def soak(bench: Bench) -> None:
    """Sustained churn, long enough for autovacuum to matter (SPEC trap 3)."""
    import psycopg

    clients, seconds = bench.cfg.soak_clients, bench.cfg.soak_seconds
    print(f"sustained churn: {clients} in-process clients for {seconds:.0f} s (autovacuum, SPEC trap 3)")
    h.reset_todos()
    h.seed_todos(bench.backlog(seconds), queue=QUEUE)
    h.analyze()
    with psycopg.connect(bench.sb_url, autocommit=True) as conn:

        def sample() -> dict[str, Any]:
            row = conn.execute(
                "SELECT n_dead_tup, autovacuum_count FROM pg_stat_user_tables WHERE relname = 'todos_todo'"
            ).fetchone()
            return {"dead": row[0], "autovacuums": row[1]} if row else {}

        before = sample()
        run = run_processes(inproc_worker, clients, seconds, "claim", 1, sample=sample)
    window = max(2.0, min(10.0, seconds / 3))
    first = _window_rate(run.timeline, 0, window)
    last = _window_rate(run.timeline, run.elapsed - window, run.elapsed)
    dead = max((s.get("dead", 0) for _, _, s in run.timeline), default=0)
    vacuums = (run.timeline[-1][2].get("autovacuums", 0) - before.get("autovacuums", 0)) if run.timeline else 0
    bench.res.add(
        Row(
            f"Switchboard in-process, sustained {seconds:.0f} s",
            clients,
            [run.rate],
            notes=f"first {window:.0f} s {first:,.0f}/s, last {window:.0f} s {last:,.0f}/s; "
            f"autovacuum ran {vacuums}x, dead tuples peaked at {dead:,}",
        )
    )


def _window_rate(timeline: list[tuple[float, int, dict[str, Any]]], start: float, end: float) -> float:
    inside = [(t, n) for t, n, _ in timeline if start - 0.5 <= t <= end + 0.5]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
