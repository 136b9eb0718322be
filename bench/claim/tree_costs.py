"""Issue 30: what agent trees cost, in one run: a create with lineage beside a plain one, a plain claim beside a
claim of a tree's todos (the budget predicate), and a cascading cancel of 10,000 descendants (target < 2 s).

    .venv/bin/python bench/claim/tree_costs.py                       # 2,000 creates and claims, cascade 10,000
    .venv/bin/python bench/claim/tree_costs.py --n 200 --cascade 1000 --rounds 1   # a smoke run

Each round times, through todos/queue/ (the transitions every door calls), alternating the order of each pair
so that both see the same machine load:

  create            N plain creates (a root each: no lineage written)
  create+lineage    N creates under one held parent (LOCK_PARENT and SPAWN_CAPS in the create's transaction)
  claim             N claims of one todo each from a queue of plain todos
  claim (tree)      N claims of one todo each from a queue of one tree's children (the budget predicate probes
                    the root by primary key; the root's budget is not spent)
  cascade           cancel(cascade=True) of a root with --cascade pending children: one transaction

Prints microseconds per create and per claim (and their ratios), and the cascade's seconds.
Todos go to the scratch database switchboard_bench_tree_costs (bench/harness.py), never the development one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

PLAIN, TREE, CASCADE = "bench.plain", "bench.tree", "bench.cascade"


def _per(n: int, seconds: float) -> float:
    return seconds / n * 1e6


def creates(agent: object, n: int, parent: dict[str, str] | None) -> float:
    from todos import queue

    start = time.perf_counter()
    for _ in range(n):
        queue.create(queue=TREE if parent else PLAIN, agent=agent, parent=parent)  # type: ignore[arg-type]
    return _per(n, time.perf_counter() - start)


def claims(agent: object, n: int, queue_name: str) -> float:
    from todos import queue

    start = time.perf_counter()
    taken = 0
    while taken < n:
        got = queue.claim_next(agent=agent, queues=[queue_name], limit=1, lease_seconds=3600)  # type: ignore[arg-type]
        assert got, f"{queue_name} ran dry after {taken}"
        taken += 1
    return _per(n, time.perf_counter() - start)


def cascade(agent: object, children: int) -> float:
    from todos import queue

    root, _ = queue.create(queue=CASCADE)
    root = queue.claim(root.id, agent=agent)  # type: ignore[arg-type]
    h.sb_sql(
        """INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
            created_at, updated_at, run_at, priority, fair_key, dependencies_left, on_dependency_failure,
            has_dependents, parent_id, root_id, depth)
        SELECT 'td_' || md5(%s || g::text), %s, '', '', '', '{}', 'pending', 0, 5, '[]', now(), now(), now(), 0,
            '', 0, 'cancel', false, %s, %s, 1
        FROM generate_series(1, %s) g""",
        [root.id, CASCADE, root.id, root.id, children],
    )
    h.analyze()
    start = time.perf_counter()
    done = queue.cancel(root.id, operator="bench", cascade=True)
    took = time.perf_counter() - start
    assert done.cascaded == min(children, 10_000), done.cascaded  # type: ignore[attr-defined]
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="creates and claims per set")
    parser.add_argument("--cascade", type=int, default=10_000, help="descendants the cascade cancels")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _, url = h.scratch_django("tree_costs")
    print(f"database {url.rsplit('/', 1)[-1].split('?')[0]}, PostgreSQL {h.pg_server().version()}")

    from todos import queue
    from todos.models import Agent

    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    agent.set_new_token()
    agent.save()
    figures: dict[str, list[float]] = {k: [] for k in ("create", "create+lineage", "claim", "claim (tree)", "cascade")}
    for round_ in range(args.rounds):
        h.reset_todos()
        holder, _ = queue.create(queue=TREE, budget={"cost_usd": 1_000_000})
        holder = queue.claim(holder.id, agent=agent)
        parent = {"id": holder.id, "lease_id": str(holder.lease_id)}
        pair = [("create", None), ("create+lineage", parent)]
        for name, given in pair if round_ % 2 == 0 else reversed(pair):
            figures[name].append(creates(agent, args.n, given))
        h.analyze()
        pair_claims = [("claim", PLAIN), ("claim (tree)", TREE)]
        for name, queue_name in pair_claims if round_ % 2 == 0 else reversed(pair_claims):
            figures[name].append(claims(agent, args.n, queue_name))
        figures["cascade"].append(cascade(agent, args.cascade))
    for name, values in figures.items():
        unit = "s" if name == "cascade" else "µs each"
        print(f"{name:16} median {statistics.median(values):10.1f} {unit}   rounds {[round(v, 1) for v in values]}")
    median = {name: statistics.median(values) for name, values in figures.items()}
    print(f"create+lineage / create: {median['create+lineage'] / median['create']:.2f}")
    print(f"claim (tree) / claim:    {median['claim (tree)'] / median['claim']:.2f}")
    print(f"cascade of {args.cascade:,}: {median['cascade']:.3f} s (target < 2 s)")


if __name__ == "__main__":
    main()
