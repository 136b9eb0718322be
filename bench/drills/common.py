"""What every failure drill shares: its own database, the project under gunicorn, the reference
worker's command line, agents, and the verdict (PASS exits 0, FAIL 1, SKIP 3).

A drill prints its figures as it goes and ends with one verdict line. SKIP means a piece the drill
needs is not in this checkout yet (the HTTP API, examples/worker.py, ingestion): it says which.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench import harness as h

EXIT_PASS, EXIT_FAIL, EXIT_SKIP = 0, 1, 3

# The reference worker (examples/worker.py, from the HTTP API issue): the one line to adjust if its flags
# change. {handler} is "module:function", called with each todo (a dict); the drills' handlers are in
# bench/drills/handlers.py. {lease} is short so a killed worker's todo comes back within seconds, and
# the long-poll is short so a stopped worker's waiting claim ends soon after it.
WORKER_CMD = (
    "{python} examples/worker.py --url {url} --token {token} --queues {queue} --handler {handler} "
    "--lease {lease} --wait 2"
)


class Skip(Exception):
    pass


class Failed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    """An invariant: a broken one fails the drill."""
    if not condition:
        raise Failed(message)
    print(f"  ok: {message}", flush=True)


def skip(reason: str) -> NoReturn:
    raise Skip(reason)


def figure(text: str) -> None:
    print(f"  FIGURE {text}", flush=True)


def run_drill(name: str, body: Callable[[], None]) -> None:
    """Run a drill's body and exit with its verdict."""
    started = time.monotonic()
    print(f"drill {name}", flush=True)
    try:
        body()
    except Skip as exc:
        print(f"SKIP {name}: {exc}", flush=True)
        sys.exit(EXIT_SKIP)
    except Failed as exc:
        print(f"FAIL {name}: {exc}", flush=True)
        sys.exit(EXIT_FAIL)
    print(f"PASS {name} ({time.monotonic() - started:.0f} s)", flush=True)
    sys.exit(EXIT_PASS)


class DrillDb:
    """A fresh database for one drill, migrated, with Django set up in this process."""

    def __init__(self, name: str, data_dir: Path | None = None) -> None:
        self.server, self.url = h.scratch_django(f"drill_{name}", server=h.pg_server(data_dir))

    def agent(self, name: str = "drill", scopes: tuple[str, ...] = ("drill*",)) -> tuple[Any, str]:
        from todos.models import Agent

        agent = Agent(name=name, claim_scopes=list(scopes), create_scopes=list(scopes))
        token = agent.set_new_token()
        agent.save()
        return agent, token

    @contextlib.contextmanager
    def gunicorn(self, **env: str) -> Iterator[str]:
        from django.db import connections

        connections.close_all()
        with h.gunicorn(self.url, env=env) as base:
            yield base


def require_api(base: str, token: str) -> None:
    status, body = h.Api(base, token).post("/api/v1/todos/claim/", {"queues": ["drill-probe"]})
    if status != 200 or not isinstance(body, dict) or "todos" not in body:
        skip(f"the todos HTTP API is not here yet (POST /api/v1/todos/claim/ answered {status})")


def require_worker() -> None:
    if not (h.ROOT / "examples" / "worker.py").exists():
        skip("examples/worker.py (the reference worker) is not here yet")


def worker_argv(url: str, token: str, queue: str, handler: str, lease: float = 5) -> list[str]:
    return shlex.split(
        WORKER_CMD.format(python=h.PYTHON, url=url, token=token, queue=queue, handler=handler, lease=lease)
    )


def start_worker(argv: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, "PYTHONPATH": str(h.ROOT), **env}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=h.ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)


def wait_until(check_fn: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check_fn():
            return True
        time.sleep(interval)
    return check_fn()


def state_counts(queue: str) -> dict[str, int]:
    from django.db import connection
    from django.db.models import Count

    from todos.models import Todo

    connection.close_if_unusable_or_obsolete()
    return dict(Todo.objects.filter(queue=queue).values_list("state").annotate(n=Count("id")).order_by())


def seed_todos(queue: str, n: int) -> set[str]:
    """n pending todos in ``queue`` (the harness's seeder), and their ids."""
    h.seed_todos(n, queue=queue, title="'drill ' || g")
    return {row[0] for row in h.sb_sql("SELECT id FROM todos_todo WHERE queue = %s", [queue])}
