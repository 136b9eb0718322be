"""What tracing costs the queue (issue 21), on bench/harness.py.

    .venv/bin/python bench/ops/tracing_overhead.py --seconds 5 --runs 3

One client, in process, the claim + complete cycle through todos/queue/ on todos that carry a
traceparent, in three modes alternating within each run (the median of the runs counts):

  today  the transitions as they were before tracing: the functions under todos/tracing.py's decorator
         (``__wrapped__``), counted as the doors count, so the same statements and the same rows;
  off    the shipped functions with tracing off (the default): the decorator's one test of a global;
  on     tracing on, with the SDK's BatchSpanProcessor as configure() sets it up and an exporter that
         drops what it is given: the cost of building and queueing two spans per cycle, not the network.

Runs in the scratch database switchboard_bench_tracing (bench/harness.py), never the development one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

QUEUE = "bench.tracing"
TRACEPARENT = "'00-' || md5(g::text) || '-' || substr(md5('s' || g::text), 1, 16) || '-01'"


def cycles(agent: Any, claim: Callable[..., Any], complete: Callable[..., Any], seconds: float) -> float:
    done, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        for todo in claim(agent=agent, queues=[QUEUE], limit=1):
            complete(todo.id, agent=agent, lease_id=todo.lease_id or "", result=None)
            done += 1
    return done / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per run and mode (default 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode; the median counts")
    parser.add_argument("--pending", type=int, default=30_000, help="pending todos seeded per run")
    args = parser.parse_args(argv)
    h.scratch_django("tracing")

    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from todos import queue, tracing
    from todos.models import Agent

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    agent = Agent(name="bench", claim_scopes=[QUEUE], create_scopes=[QUEUE])  # unsaved
    # Under each door's counter (the outermost wrapper) is the tracing decorator, and under that the
    # transition as it was: today is that, counted again as the door counts it.
    from todos.metrics import counted

    today_claim = counted("claim_next", lambda todos: "ok" if todos else "empty")(
        queue.claim_next.__wrapped__.__wrapped__  # type: ignore[attr-defined]
    )
    today_complete = counted("complete")(queue.complete.__wrapped__.__wrapped__)  # type: ignore[attr-defined]
    modes = {
        "today": (today_claim, today_complete),
        "off": (queue.claim_next, queue.complete),
        "on": (queue.claim_next, queue.complete),
    }
    tracing.configure(exporter=Dropped())  # a SimpleSpanProcessor; swapped for the batch one below
    assert tracing._provider is not None
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracing._provider._active_span_processor._span_processors = (BatchSpanProcessor(Dropped()),)
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for run in range(args.runs):
        order = list(modes) if run % 2 == 0 else list(reversed(modes))
        for mode in order:
            h.reset_todos()
            h.seed_todos(args.pending, queue=QUEUE, traceparent=TRACEPARENT)
            h.analyze()
            tracing.ENABLED = mode == "on"
            claim, complete = modes[mode]
            rates[mode].append(cycles(agent, claim, complete, args.seconds))
        print("  run {}: {}".format(run + 1, ", ".join(f"{m} {rates[m][-1]:,.0f}/s" for m in modes)), flush=True)
    tracing.ENABLED = False
    micro = per_call_costs(tracing, queue, agent)
    today, off, on = (h.median(rates[m]) for m in modes)
    print(f"claim+complete cycles/s, one client in process, median of {args.runs} runs of {args.seconds:g} s")
    print("| today | tracing off | tracing on | off / today | on / today |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(f"| {today:,.0f} | {off:,.0f} | {on:,.0f} | {off / today:.2f} | {on / today:.2f} |")
    print(
        "per transition, CPU only (no database): the decorator off {off_ns:.0f} ns; on, one span built and "
        "queued {on_us:.1f} us".format(**micro)
    )
    return 0


def per_call_costs(tracing: Any, queue: Any, agent: Any, n: int = 200_000) -> dict[str, float]:
    """The decorator's own cost, off and on, around a transition that returns a todo at once: steady
    where the cycles above are at the mercy of a shared machine."""
    from todos.models import Todo

    todo = Todo(
        id="td_" + "0" * 32, queue=QUEUE, state="done", attempt=1, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    )

    def bare() -> Todo:
        return todo

    wrapped = tracing.traced("complete")(bare)
    tracing.ENABLED = False
    started = time.perf_counter()
    for _ in range(n):
        bare()
    base = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(n):
        wrapped()
    off = time.perf_counter() - started
    tracing.ENABLED = True
    m = n // 10
    started = time.perf_counter()
    for _ in range(m):
        wrapped()
    on = time.perf_counter() - started
    tracing.ENABLED = False
    return {"off_ns": (off - base) / n * 1e9, "on_us": (on - base / 10) / m * 1e6}


if __name__ == "__main__":
    raise SystemExit(main())
