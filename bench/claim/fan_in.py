"""Issue 20: what completing the children of a fan-in costs, beside a plain complete, in one run.

    .venv/bin/python bench/claim/fan_in.py                          # 10,000 children, 3 rounds
    .venv/bin/python bench/claim/fan_in.py --children 2000 --rounds 1   # a quick look
    .venv/bin/python bench/claim/fan_in.py --http --rounds 1            # each complete a POST to gunicorn
    .venv/bin/python bench/claim/fan_in.py --http --rounds 2 --sample 1500  # the first 1,500 of the 10,000
    .venv/bin/python bench/claim/fan_in.py --interleave --rounds 1      # one plain, one child, in turn
    .venv/bin/python bench/claim/fan_in.py --interleave --rounds 1 --via wait   # parents that wait for 100 each

Each round times two sets of N claimed todos completed one by one through todos/queue/'s complete (the
transition every door calls), in alternating order so that both see the same machine load:

  plain    N todos nobody depends on
  fan-in   the N children of one parent made with depends_on (every child's complete counts one off the
           parent; the last one makes it pending), i.e. one statement that also settles a dependent

--via wait: the children's parents are claimed todos that wait for them (`wait` for {"todos": [...]}, at most
100 each: N/100 parents), the same edges and function plus the waiter's waitpoint, locked by each child's
complete. Otherwise the parent names all N children, past the API's 100 (queue.create takes any
number; the limit is the input's): the worst fan-in, one parent row that every child updates. Prints
per-complete microseconds and the ratio (target: at most 1.2). --interleave: one plain complete, then one
child's, and so on (the first of each pair alternating), each timed alone, medians per complete: on a loaded
machine a burst of load then falls on both sets alike, where timing each set as a whole lets it fall on one.
--http: the same completes as agents send them, POST /api/v1/todos/<id>/complete/ one at a time on one
keep-alive connection to gunicorn (gunicorn.conf.py).
Todos go to the scratch database switchboard_bench_fan_in (bench/harness.py: on the embedded server, or on
DATABASE_URL's), never the development one.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

KIDS, PLAIN, PARENT = "bench.kids", "bench.plain", "bench.parent"


def claimed(queue_name: str, n: int, agent: object) -> list[tuple[str, str]]:
    from todos import queue

    made = queue.create_many([{"queue": queue_name} for _ in range(min(n, 1000))])
    while len(made) < n:
        made += queue.create_many([{"queue": queue_name} for _ in range(min(n - len(made), 1000))])
    held: list[tuple[str, str]] = []
    while len(held) < n:
        got = queue.claim_next(agent=agent, queues=[queue_name], limit=100, lease_seconds=3600)  # type: ignore[arg-type]
        held += [(t.id, t.lease_id or "") for t in got]
    return held


def complete_all(held: list[tuple[str, str]], agent: object, api: h.Api | None = None) -> float:
    from todos import queue

    start = time.perf_counter()
    for todo_id, lease_id in held:
        if api is None:
            queue.complete(todo_id, agent=agent, lease_id=lease_id)  # type: ignore[arg-type]
        else:
            status, body = api.post(f"/api/v1/todos/{todo_id}/complete/", {"lease_id": lease_id})
            assert status == 200, (status, body)
    return (time.perf_counter() - start) / len(held) * 1e6


def complete_interleaved(
    plain: list[tuple[str, str]], kids: list[tuple[str, str]], agent: object, api: h.Api | None = None
) -> tuple[float, float]:
    """Median microseconds per complete of each set, completing them in turn."""
    from todos import queue

    def one(todo_id: str, lease_id: str) -> float:
        start = time.perf_counter()
        if api is None:
            queue.complete(todo_id, agent=agent, lease_id=lease_id)  # type: ignore[arg-type]
        else:
            status, body = api.post(f"/api/v1/todos/{todo_id}/complete/", {"lease_id": lease_id})
            assert status == 200, (status, body)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"plain": [], "fan-in": []}
    for n, (p, k) in enumerate(zip(plain, kids, strict=True)):
        pair = [("plain", p), ("fan-in", k)] if n % 2 == 0 else [("fan-in", k), ("plain", p)]
        for mode, (todo_id, lease_id) in pair:
            times[mode].append(one(todo_id, lease_id))
    return statistics.median(times["plain"]) * 1e6, statistics.median(times["fan-in"]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=0, help="time only the first N completes of each set")
    parser.add_argument("--http", action="store_true", help="complete over HTTP (gunicorn) instead of in-process")
    parser.add_argument("--interleave", action="store_true", help="complete one of each set in turn, each timed")
    parser.add_argument("--via", choices=["create", "wait"], default="create", help="the parent depends or waits")
    args = parser.parse_args()
    _, url = h.scratch_django("fan_in")
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(h.gunicorn(url)) if args.http else None
        measure(args, base)


def measure(args: argparse.Namespace, base: str | None) -> None:
    from todos import queue
    from todos.models import Agent, Todo

    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    api = h.Api(base, token) if base else None
    figures: dict[str, list[float]] = {"plain": [], "fan-in": []}
    for r in range(args.rounds):
        h.reset_todos()
        h.sb_sql("TRUNCATE todos_dependency")
        kids = claimed(KIDS, args.children, agent)
        if args.via == "wait":
            parents = claimed(PARENT, -(-len(kids) // 100), agent)
            for n, (parent_id, lease_id) in enumerate(parents):
                awaited = [i for i, _ in kids[n * 100 : (n + 1) * 100]]
                queue.wait(
                    parent_id, agent=agent, lease_id=lease_id, wait_for={"todos": awaited}, timeout_seconds=86400
                )
            parent_ids = [i for i, _ in parents]
        else:
            parent_ids = [queue.create(queue=PARENT, depends_on=[i for i, _ in kids])[0].id]
        plain = claimed(PLAIN, args.children, agent)
        h.analyze()
        if args.interleave:
            plain_us, fan_us = complete_interleaved(
                plain[: args.sample or None], kids[: args.sample or None], agent, api
            )
            figures["plain"].append(plain_us)
            figures["fan-in"].append(fan_us)
        else:
            order = [("plain", plain), ("fan-in", kids)] if r % 2 == 0 else [("fan-in", kids), ("plain", plain)]
            for mode, held in order:
                figures[mode].append(complete_all(held[: args.sample or None], agent, api))
        states = set(Todo.objects.filter(pk__in=parent_ids).values_list("state", flat=True))
        if not args.sample:
            assert states == {"pending"}, f"parents are {states} after their last child completed"
        print(f"round {r + 1}: " + ", ".join(f"{m} {v[-1]:.0f} us" for m, v in figures.items()), flush=True)
    plain_us, fan_us = statistics.median(figures["plain"]), statistics.median(figures["fan-in"])
    timed = f", first {args.sample} timed" if args.sample else ""
    how = ("HTTP" if base else "in-process") + (", interleaved" if args.interleave else "") + f", via {args.via}"
    print(f"children {args.children}{timed}, rounds {args.rounds} (medians), {how}")
    print(f"plain complete        {plain_us:8.0f} us")
    print(f"fan-in child complete {fan_us:8.0f} us")
    print(f"ratio                 {fan_us / plain_us:8.2f}  (target <= 1.2)")


if __name__ == "__main__":
    main()
