"""Drains of no-op todos by each of Switchboard's workers, at concurrency 1 / 4 / 16, in one run (issue 32):

- ``switchboard worker`` (the remote runtime over HTTP, its defaults, one process, then ``--processes 2``
  with the concurrency split between them),
- ``manage.py work`` (the in-process worker: claim_next batches and complete_many, no HTTP),
- one claim + one complete per todo over HTTP (N loops), the baseline the runtime must beat at 1.

    .venv/bin/python bench/http/worker_drain.py [--todos 20000] [--runs 2] [--concurrency 1,4,16]
        [--only runtime,processes,inprocess,one_by_one] [--before COMMIT]

``--before COMMIT`` adds ``runtime_before``: the same ``switchboard worker`` command with that commit's
client (clients/python/src, extracted by git archive into bench/out/), against the same server, in the
same run: before and after side by side.

bench/peers3's method: the todos are seeded pending, each worker runs as its own process(es) with
--drain, and the figure is read from the database: todos / (last completed_at - first claimed_at).
Beside it: the load average before and after each drain (other work on the machine shows there) and
the CPU seconds the worker processes used per 1,000 todos. The server is the shipped one (gunicorn +
uvicorn workers, gunicorn.conf.py) on a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))

from switchboard_client import AsyncClient

from bench import harness as h

ROOT = Path(__file__).resolve().parents[2]

QUEUE = "bench.drain"
AGENT = "bench"
HANDLERS = """
async def noop(todo):
    return None

def handle(todo):
    return None

handlers = {"*": noop}
"""


def make_token() -> str:
    from todos.models import Agent

    Agent.objects.filter(name=AGENT).delete()
    agent = Agent(name=AGENT, claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    return token


def seed(n: int) -> None:
    from django.db import connection

    h.reset_todos()
    h.seed_todos(n, queue=QUEUE)
    h.analyze()
    connection.close()


def drained(n: int) -> tuple[int, float]:
    """(todos done, todos/s from the first claim to the last completion), read from the database."""
    [(done, span)] = h.sb_sql(
        "SELECT count(*) FILTER (WHERE state = 'done'), "
        "EXTRACT(EPOCH FROM max(completed_at) - min(claimed_at)) FROM todos_todo WHERE queue = %s",
        [QUEUE],
    )
    return int(done), (int(done) / float(span) if span else float("nan"))


def client_of(commit: str) -> Path:
    """``commit``'s clients/python/src under bench/out/ (extracted once, by git archive)."""
    dest = h.out_dir() / f"client-{commit}"
    if not (dest / "clients" / "python" / "src").exists():
        blob = subprocess.run(
            ["git", "archive", commit, "clients/python/src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest / "clients" / "python" / "src"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_processes(commands: list[list[str]], env: dict[str, str], cwd: Path) -> None:
    procs = [
        subprocess.Popen(c, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in commands
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}:\n{out}")


async def one_by_one(base: str, token: str, concurrency: int) -> None:
    """Each loop claims one todo and completes it before the next claim."""
    async with AsyncClient(base, token) as client:

        async def loop() -> None:
            while todos := await client.claim([QUEUE], limit=1, lease_seconds=60):
                await client.complete(todos[0], result=None)

        await asyncio.gather(*(loop() for _ in range(concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--only", default="runtime,processes,inprocess,one_by_one")
    parser.add_argument("--before", help="a commit whose client runs as runtime_before, in the same run")
    args = parser.parse_args()
    kinds = args.only.split(",") + (["runtime_before"] if args.before else [])
    server, url = h.scratch_django("worker_drain")
    token = make_token()
    print(h.machine_summary(server))
    work = h.out_dir() / "worker_drain"
    work.mkdir(exist_ok=True)
    (work / "bench_noop.py").write_text(textwrap.dedent(HANDLERS))
    env = h.project_env(url, PYTHONPATH=os.pathsep.join([str(work), str(ROOT), str(ROOT / "clients/python/src")]))
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: dict[int, dict[str, float]] = {}
    with h.gunicorn(url) as base:
        client_env = {**env, "SWITCHBOARD_URL": base, "SWITCHBOARD_TOKEN": token}
        before_env = {}
        if args.before:
            paths = [str(work), str(client_of(args.before)), str(ROOT)]
            before_env = {**client_env, "PYTHONPATH": os.pathsep.join(paths)}
        runtime = [sys.executable, "-m", "switchboard_client", "worker", "bench_noop:handlers", "--drain"]
        runtime += ["--queues", QUEUE]
        for c in levels:
            figures: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.runs):
                for kind in kinds:
                    if kind == "processes" and c < 2:
                        continue
                    seed(args.todos)
                    load_before, cpu_before = os.getloadavg()[0], children_cpu()
                    if kind == "runtime":
                        run_processes([[*runtime, "--concurrency", str(c)]], client_env, work)
                    elif kind == "runtime_before":
                        run_processes([[*runtime, "--concurrency", str(c)]], before_env, work)
                    elif kind == "processes":
                        run_processes([[*runtime, "--concurrency", str(c // 2), "--processes", "2"]], client_env, work)
                    elif kind == "inprocess":
                        command = [sys.executable, str(ROOT / "manage.py"), "work", "--agent", AGENT, "--drain"]
                        command += ["--handler", "bench_noop:handle", "--queue", QUEUE, "--concurrency", str(c)]
                        run_processes([command], env, work)
                    else:
                        asyncio.run(one_by_one(base, token, c))
                    done, rate = drained(args.todos)
                    assert done == args.todos, (kind, done, args.todos)
                    cpu = children_cpu() - cpu_before
                    figures[kind].append(rate)
                    # one_by_one runs in this process: its CPU is not a child's.
                    cpu_text = "-" if kind == "one_by_one" else f"{cpu / done * 1000:.2f} s"
                    print(
                        f"concurrency {c} {kind}: {rate:,.0f}/s, worker CPU {cpu_text} per 1,000, "
                        f"load {load_before:.2f} -> {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
            rows[c] = {k: statistics.median(v) for k, v in figures.items() if v}
    print()
    print("| concurrency | " + " | ".join(kinds) + " |")
    print("| --- |" + " ---: |" * len(kinds))
    for c, medians in rows.items():
        print(f"| {c} | " + " | ".join(f"{medians[k]:,.0f}" if k in medians else "-" for k in kinds) + " |")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
