#!/usr/bin/env python3
"""The request path's cost, in one run: claim+complete cycles per second in-process (todos/queue/), over
HTTP through Switchboard (the Procfile's server: gunicorn.conf.py, uvicorn workers), and over HTTP through
the bare ceiling (bench/http/ceiling_app.py: the same two statements under the same server, nothing else).

    .venv/bin/python bench/http/request_path.py [--seconds 5] [--clients 1,4,16] [--before DIR]

``--before DIR`` adds another Switchboard, served from a checkout at DIR (e.g. ``git archive <commit> |
tar -x -C DIR``) with the same virtualenv and database: before/after figures in one run.

Each client is its own process with one keep-alive connection (bench/harness.py's Api); a cycle is
POST /api/v1/todos/claim/ then POST /api/v1/todos/<id>/complete/. Every run starts from the same seed
(a scratch database, switchboard_bench_request_path, of the embedded server or DATABASE_URL's).
Issue 19's targets: Switchboard at least 0.8 of the ceiling at 1, 4 and 16 clients, and at least 0.5
of in-process at 16.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness

QUEUE = "bench.path"
AGENT = "bench"


def _http_client(base: str, token: str, seconds: float, start: Any, out: Any) -> None:
    api = harness.Api(base, token)
    start.wait()
    cycles = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, body = api.post("/api/v1/todos/claim/", {"queues": [QUEUE]})
        if status != 200 or not body["todos"]:
            raise SystemExit(f"claim answered {status} {body}: the seed ran out?")
        todo = body["todos"][0]
        status, _ = api.post(f"/api/v1/todos/{todo['id']}/complete/", {"lease_id": todo["lease_id"]})
        if status != 200:
            raise SystemExit(f"complete answered {status}")
        cycles += 1
    api.close()
    with out.get_lock():
        out.value += cycles


def _inprocess_client(seconds: float, start: Any, out: Any) -> None:
    from todos import queue
    from todos.models import Agent

    agent = Agent.objects.get(name=AGENT)
    start.wait()
    cycles = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        [todo] = queue.claim_next(agent=agent, queues=[QUEUE])
        assert todo.lease_id is not None
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
        cycles += 1
    with out.get_lock():
        out.value += cycles


def _run(clients: int, seconds: float, target: Callable[..., None], *args: Any) -> float:
    """Cycles per second of ``clients`` processes running ``target`` together for ``seconds``."""
    from django.db import connections

    connections.close_all()  # forked children open their own
    start, out = mp.Event(), mp.Value("l", 0)
    procs = [mp.Process(target=target, args=(*args, seconds, start, out)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    time.sleep(0.5)
    start.set()
    for proc in procs:
        proc.join(seconds + 60)
        if proc.exitcode != 0:
            raise SystemExit(f"a client failed (exit {proc.exitcode})")
    return float(out.value) / seconds


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(x) for x in f.read().split()]
    return found


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants: a gunicorn master and its workers."""
    tick = os.sysconf("SC_CLK_TCK")
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        with contextlib.suppress(FileNotFoundError):
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            stack += _children(p)
    return total


def _master(base: str) -> int:
    """The pid of this process's child gunicorn serving ``base`` (found by its GUNICORN_BIND)."""
    bind = base.removeprefix("http://")
    for pid in _children(os.getpid()):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"GUNICORN_BIND={bind}".encode() in f.read().split(b"\0"):
                    return pid
    raise RuntimeError(f"no gunicorn child serves {base}")


def _seed(n: int) -> None:
    harness.reset_todos()
    harness.seed_todos(n, queue=QUEUE)
    harness.analyze()


@contextlib.contextmanager
def _before(database_url: str, directory: Path) -> Iterator[str]:
    """gunicorn serving the checkout at ``directory`` (its own code and gunicorn.conf.py)."""
    import subprocess

    port = harness.free_port()
    env = harness.project_env(database_url, GUNICORN_BIND=f"127.0.0.1:{port}", PYTHONPATH=str(directory))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = open(harness.out_dir() / f"gunicorn-before-{port}.log", "w")
    proc = subprocess.Popen(
        [harness.PYTHON, "-m", "gunicorn", harness.APP, "-c", "gunicorn.conf.py"],
        cwd=directory,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(OSError):
                if harness.Api(base, timeout=2).get("/readyz")[0] == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the 'before' server did not start; see {log.name}")
            time.sleep(0.2)
        yield base
    finally:
        harness.stop(proc, timeout=30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--before", type=Path, help="a checkout to measure beside this one")
    parser.add_argument("--seed", type=int, default=40_000, help="todos seeded before each run")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    server, url = harness.scratch_django("request_path")
    from todos.models import Agent

    Agent.objects.filter(name=AGENT).delete()
    agent = Agent(name=AGENT, claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    print(harness.machine_summary(server))
    threads = os.environ.get("WEB_THREADS", "8 (default)")
    print(f"load average at start: {os.getloadavg()[0]:.1f}; WEB_THREADS={threads}")

    labels = ["in-process", "Switchboard", "ceiling"] + (["before"] if args.before else [])
    rows: list[tuple[int, dict[str, float]]] = []
    with contextlib.ExitStack() as stack:
        bases = {
            "Switchboard": stack.enter_context(harness.gunicorn(url)),
            "ceiling": stack.enter_context(
                harness.gunicorn(url, app="bench.http.ceiling_app:app", log_name="ceiling", env={"CEILING_DSN": url})
            ),
        }
        if args.before:
            bases["before"] = stack.enter_context(_before(url, args.before.resolve()))
        masters = {label: _master(base) for label, base in bases.items()}
        cpus: list[tuple[int, dict[str, float]]] = []
        for n in levels:
            figures: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for label in labels:
                _seed(args.seed)
                if label == "in-process":
                    figures[label] = _run(n, args.seconds, _inprocess_client)
                else:
                    used = _tree_cpu(masters[label])
                    figures[label] = _run(n, args.seconds, _http_client, bases[label], token)
                    used = _tree_cpu(masters[label]) - used
                    cpu[label] = used * 1000 / max(1.0, figures[label] * args.seconds)
            rows.append((n, figures))
            cpus.append((n, cpu))
            print(f"{n} clients: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in figures.items()), flush=True)
            print(
                f"  load {os.getloadavg()[0]:.1f}; server CPU ms per cycle: "
                + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()),
                flush=True,
            )

    print()
    head = "| clients | in-process | Switchboard HTTP | ceiling HTTP |"
    rule = "| --- | --- | --- | --- |"
    if args.before:
        head += " before HTTP |"
        rule += " --- |"
    print(head + " Switchboard / ceiling | Switchboard / in-process |")
    print(rule + " --- | --- |")
    for n, f in rows:
        before = f" {f['before']:,.0f} |" if args.before else ""
        print(
            f"| {n} | {f['in-process']:,.0f} | {f['Switchboard']:,.0f} | {f['ceiling']:,.0f} |{before} "
            f"{f['Switchboard'] / f['ceiling']:.2f} | {f['Switchboard'] / f['in-process']:.2f} |"
        )
    print()
    print("Server CPU per claim+complete cycle, ms (gunicorn master and workers, from /proc: load moves it less")
    print("than it moves throughput):")
    print()
    print("| clients | " + " | ".join(label for label in labels if label != "in-process") + " |")
    print("| --- |" + " --- |" * (len(labels) - 1))
    for n, c in cpus:
        print(f"| {n} | " + " | ".join(f"{c[label]:.2f}" for label in labels if label != "in-process") + " |")
    print()
    for n, f in rows:
        ratio = f["Switchboard"] / f["ceiling"]
        print(f"  [{'met' if ratio >= 0.8 else 'MISSED'}] {n} clients: Switchboard / ceiling {ratio:.2f} >= 0.8")
    top_n, top = rows[-1]
    ratio = top["Switchboard"] / top["in-process"]
    print(f"  [{'met' if ratio >= 0.5 else 'MISSED'}] {top_n} clients: Switchboard / in-process {ratio:.2f} >= 0.5")


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
