"""Issue 30: what agent trees cost, in one run: a create with lineage beside a plain one, a plain claim beside a
claim of a tree's todos (the budget predicate), and a cascading cancel of 10,000 descendants (target < 2 s).

    .venv/bin/python bench/claim/tree_costs.py                       # 2,000 creates and claims, cascade 10,000
    .venv/bin/python bench/claim/tree_costs.py --n 300 --cascade 2000 --rounds 2   # a smoke run
    .venv/bin/python bench/claim/tree_costs.py --before a904ce4      # and main's statements at a904ce4, from git

Each round times, through todos/queue/ (the transitions every door calls), each group's sets interleaved one
operation at a time (one of each in turn, their order rotated every turn, each operation timed on its own), so
that all see the same machine load; a warm-up round of N / 10 each comes first, not counted:

  create                  N plain creates (a root each: no lineage written)
  create+lineage          N creates under one held parent, a root without a budget (one statement, sql.SPAWN)
  create+lineage (budget) N creates under one held parent, a root with a budget (the children are marked)
  create+lineage before   (--before) N creates under a parent as main ran them at that commit: LOCK_PARENT,
                          SPAWN_CAPS and CREATE_MANY in one transaction (its statements, read from git)
  claim                   N claims of one todo each from a queue of plain todos
  claim (tree)            N claims from a queue of a budget-less tree's children (no root read)
  claim (tree, budget)    N claims from a queue of a budgeted tree's children (a primary-key probe of the root)
  claim (budget) before   (--before) the same as main's CLAIM_NEXT at that commit ran it, on a budgeted tree's
                          children created by the before set
  cascade                 cancel(cascade=True) of a root with --cascade pending children: one transaction

Prints microseconds per create and per claim (and their ratios), and the cascade's seconds.
Todos go to the scratch database switchboard_bench_tree_costs (bench/harness.py), never the development one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h

PLAIN, TREE, BUDGET, BEFORE, CASCADE = "bench.plain", "bench.tree", "bench.budget", "bench.before", "bench.cascade"


def _per(n: int, seconds: float) -> float:
    return seconds / n * 1e6


def statements_at(commit: str, url: str) -> dict[str, str]:
    """LOCK_PARENT, SPAWN_CAPS, CREATE_MANY and CLAIM_NEXT as todos.sql had them at ``commit`` (git archive)."""
    from bench.claim.claim_cost import wave1_tree

    tree = wave1_tree(commit)
    names = ["LOCK_PARENT", "SPAWN_CAPS", "CREATE_MANY", "CLAIM_NEXT"]
    out = subprocess.run(
        [
            h.PYTHON,
            "-c",
            f"import json; from todos import sql; print(json.dumps({{n: getattr(sql, n) for n in {names}}}))",
        ],
        cwd=tree,
        env=h.project_env(url, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


Op = Callable[[], object]


def create(agent: Any, queue_name: str, parent: dict[str, str] | None) -> Op:
    from todos import queue

    return lambda: queue.create(queue=queue_name, agent=agent, parent=parent)


def create_before(agent: Any, parent: dict[str, str], old: dict[str, str]) -> Op:
    """A create under a parent as main ran it at --before: todos/queue/lineage.py's spawn (LOCK_PARENT, then
    SPAWN_CAPS), then CREATE_MANY with the lineage in the item, in one transaction."""
    from django.conf import settings
    from django.db import transaction

    from todos.models import new_todo_id, visible_patterns
    from todos.rows import fetch_todos, fetchall

    receipt = {**parent, "agent": agent.name, "visible": visible_patterns(agent)}
    defaults = {"max_attempts": settings.QUEUE_DEFAULT_MAX_ATTEMPTS, "on_dependency_failure": "cancel"}

    def run() -> None:
        with transaction.atomic():
            [(parent_id, root_id, depth)] = fetchall(old["LOCK_PARENT"], receipt)
            verdict = fetchall(old["SPAWN_CAPS"], {"root": root_id, "parent": parent_id, "depth": depth, "n": 1})
            assert verdict and verdict[0][0] is None, verdict
            item = {"id": new_todo_id(), "queue": BEFORE, "parent_id": parent_id, "root_id": root_id, "depth": depth}
            [made] = fetch_todos(old["CREATE_MANY"], {"items": json.dumps([item]), **defaults})
            assert made.parent_id == parent_id

    return run


def claim(agent: Any, queue_name: str, statement: str | None = None) -> Op:
    """One claim from ``queue_name``: queue.claim_next, or ``statement`` (main's CLAIM_NEXT at --before) run as
    claim_next runs it on a plain queue."""
    from todos import queue
    from todos.models import glob_to_like
    from todos.rows import fetch_todos

    params = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [glob_to_like(queue_name)],
        "agent": agent.name,
        "owner": agent.name,
        "limit": 1,
        "lease_seconds": 3600.0,
        "reserve": 0,  # the fair turn alone: this loop runs no CLAIM_FAIR_READY (issue 31)
    }

    def run() -> None:
        if statement is None:
            got = queue.claim_next(agent=agent, queues=[queue_name], limit=1, lease_seconds=3600)
        else:
            got = fetch_todos(statement, params)
        assert got and got[0].id, f"{queue_name} ran dry"

    return run


def interleaved(ops: list[tuple[str, Op]], n: int) -> dict[str, float]:
    """Each op n times, one of each in turn (their order rotated every time), each timed on its own: all see
    the same machine load. -> microseconds per op, by name."""
    spent = dict.fromkeys((name for name, _ in ops), 0.0)
    for i in range(n):
        k = i % len(ops)
        for name, op in ops[k:] + ops[:k]:
            start = time.perf_counter()
            op()
            spent[name] += time.perf_counter() - start
    return {name: _per(n, seconds) for name, seconds in spent.items()}


def cascade(agent: Any, children: int) -> float:
    from todos import queue

    root, _ = queue.create(queue=CASCADE)
    root = queue.claim(root.id, agent=agent)
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
    parser.add_argument("--before", default="", help="a commit whose create-under-a-parent and claim to run too")
    args = parser.parse_args()
    _, url = h.scratch_django("tree_costs")
    print(f"database {url.rsplit('/', 1)[-1].split('?')[0]}, PostgreSQL {h.pg_server().version()}")
    old = statements_at(args.before, url) if args.before else {}

    from todos import queue
    from todos.models import Agent

    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    agent.set_new_token()
    agent.save()

    def holder(queue_name: str, **create: Any) -> dict[str, str]:
        held = queue.claim(queue.create(queue=queue_name, **create)[0].id, agent=agent)
        return {"id": held.id, "lease_id": str(held.lease_id)}

    names = ["create", "create+lineage", "create+lineage (budget)", "create+lineage before"]
    names += ["claim", "claim (tree)", "claim (tree, budget)", "claim (budget) before", "cascade"]
    figures: dict[str, list[float]] = {k: [] for k in names if args.before or "before" not in k}
    for round_ in range(-1, args.rounds):  # round -1: a warm-up of every set, n / 10 each, not counted
        n = max(args.n // 10, 1) if round_ < 0 else args.n
        h.reset_todos()
        big = {"cost_usd": 1_000_000}
        tree, budget = holder(TREE), holder(BUDGET, budget=big)
        creates: list[tuple[str, Op]] = [
            ("create", create(agent, PLAIN, None)),
            ("create+lineage", create(agent, TREE, tree)),
            ("create+lineage (budget)", create(agent, BUDGET, budget)),
        ]
        if old:
            creates.append(("create+lineage before", create_before(agent, holder(BEFORE, budget=big), old)))
        took = interleaved(creates, n)
        h.analyze()
        claims: list[tuple[str, Op]] = [
            ("claim", claim(agent, PLAIN)),
            ("claim (tree)", claim(agent, TREE)),
            ("claim (tree, budget)", claim(agent, BUDGET)),
        ]
        if old:
            claims.append(("claim (budget) before", claim(agent, BEFORE, old["CLAIM_NEXT"])))
        took.update(interleaved(claims, n))
        if round_ >= 0:
            for name, value in took.items():
                figures[name].append(value)
        if round_ >= 0:
            figures["cascade"].append(cascade(agent, args.cascade))
    print(f"load {Path('/proc/loadavg').read_text().strip()}")
    for name, values in figures.items():
        unit = "s" if name == "cascade" else "µs each"
        print(f"{name:24} median {statistics.median(values):10.1f} {unit}   rounds {[round(v, 1) for v in values]}")
    median = {name: statistics.median(values) for name, values in figures.items()}
    for name, base in (
        ("create+lineage", "create"),
        ("create+lineage (budget)", "create"),
        ("create+lineage before", "create"),
        ("claim (tree)", "claim"),
        ("claim (tree, budget)", "claim"),
        ("claim (budget) before", "claim"),
    ):
        if name in median:
            print(f"{name + ' / ' + base + ':':36} {median[name] / median[base]:.2f}")
    print(f"cascade of {args.cascade:,}: {median['cascade']:.3f} s (target < 2 s)")


if __name__ == "__main__":
    main()
