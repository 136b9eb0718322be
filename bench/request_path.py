#!/usr/bin/env python3
"""The request path's cost: claim+complete cycles per second in-process (todos/queue.py), over HTTP
through Switchboard (gunicorn.conf.py: uvicorn workers), and over HTTP through the bare ceiling
(bench/ceiling_app.py: the same two statements under the same server, nothing else), in one run.

    .venv/bin/python bench/request_path.py [--seconds 5] [--clients 4,16]

Uses bench/http_throughput.py's database (switchboard_bench_http), seeding and clients: each client is
its own process with one keep-alive connection; a cycle is POST /todos/claim/ then POST
/todos/<id>/complete/.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import http_throughput as ht
from bench.harness import free_port


def _ceiling(port: int, dsn: str) -> subprocess.Popen[bytes]:
    env = {**ht.os.environ, "CEILING_DSN": dsn, "GUNICORN_BIND": f"127.0.0.1:{port}"}
    proc = subprocess.Popen(
        [str(ht.ROOT / ".venv/bin/gunicorn"), "bench.ceiling_app:app", "-c", str(ht.ROOT / "gunicorn.conf.py")],
        cwd=ht.ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(port)
    return proc


def _wait(port: int) -> None:
    import socket
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="4,16")
    args = parser.parse_args()
    ht.setup_django()
    from django.core.management import call_command
    from django.db import connection

    from todos.models import Agent

    call_command("migrate", verbosity=0)
    Agent.objects.filter(name="bench").delete()
    agent = Agent(name="bench", claim_scopes=["bench.*"], create_scopes=["bench.*"])
    token = agent.set_new_token()
    agent.save()
    s = connection.settings_dict
    dsn = f"postgresql://{s['USER']}@/{s['NAME']}?host={s['HOST']}"
    connection.close()
    budget = 3000
    switchboard_port, ceiling_port = free_port(), free_port()
    servers = [ht.start_gunicorn(switchboard_port), _ceiling(ceiling_port, dsn)]
    rows = []
    try:
        for n in (int(c) for c in args.clients.split(",")):
            figures = []
            for label in ("in-process", "switchboard", "ceiling"):
                ht.preload(int(budget * args.seconds * max(1, min(n, 4))))
                connection.close()
                if label == "in-process":
                    cycles = sum(ht.run_clients(ht._inprocess_client, lambda: ("bench",), n, args.seconds))
                else:
                    port = switchboard_port if label == "switchboard" else ceiling_port
                    results = ht.run_clients(ht._http_client, lambda port=port: (port, token, 1), n, args.seconds)
                    cycles = sum(c for c, _ in results)
                figures.append(cycles / args.seconds)
            rows.append((n, *figures))
            print(
                f"{n} clients: in-process {figures[0]:.0f}/s, "
                f"Switchboard {figures[1]:.0f}/s, ceiling {figures[2]:.0f}/s"
            )
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
    print()
    print(
        "| clients | in-process | Switchboard HTTP | ceiling HTTP | Switchboard / in-process | Switchboard / ceiling |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for n, inproc, board, ceiling in rows:
        print(f"| {n} | {inproc:,.0f} | {board:,.0f} | {ceiling:,.0f} | {board / inproc:.2f} | {board / ceiling:.2f} |")


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
