"""The alternatives' side of bench/compare/compare.py: each one's own workers, started and drained on its own
database, timed by the library's own start and finish timestamps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import harness as h


def alt_plan(name: str, clients: int) -> tuple[int, int]:
    """(processes, concurrency per process) matching ``clients`` for an alternative's own worker.
    Procrastinate is async: one process runs several jobs at once, so it gets 1 x 1, 1 x 4, 2 x 8 (its
    own advice: processes up to the cores, concurrency within). django-tasks' db_worker runs one job
    at a time, so it gets one process per client."""
    if name == "procrastinate":
        procs = 1 if clients <= 4 else 2
        return procs, clients // procs
    return clients, 1


_ALT_SQL = {
    "procrastinate": {
        "reset": "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE",
        "left": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        "span": """SELECT count(*) FILTER (WHERE type = 'succeeded'), min(at) FILTER (WHERE type = 'started'),
                   max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events""",
        "ready": "SELECT count(*) FROM procrastinate_workers",
    },
    "django_tasks": {
        "reset": "TRUNCATE django_tasks_database_dbtaskresult",
        "left": "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status IN ('READY', 'RUNNING')",
        "span": """SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), min(started_at), max(finished_at)
                   FROM django_tasks_database_dbtaskresult""",
        # One connection per worker once it polls.
        "ready": """SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                    AND pid <> pg_backend_pid() AND backend_type = 'client backend'""",
    },
}


def _alt_worker_cmd(name: str, concurrency: int) -> list[str]:
    if name == "procrastinate":
        return [h.PYTHON, "-m", "django", "procrastinate", "worker", "--concurrency", str(concurrency)]
    # --interval is the idle poll: 0.1 s so that every worker starts within 0.1 s of the jobs appearing.
    return [h.PYTHON, "-m", "django", "db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload", "-v", "0"]


def alt_drain(
    name: str, url: str, settings_module: str, procs: int, concurrency: int, jobs: int
) -> tuple[float, float]:
    """Start the workers, wait until all are up, enqueue ``jobs`` at once, time the drain.
    Returns (jobs/s from the first start to the last finish, by the library's own timestamps;
    enqueue jobs/s)."""
    import psycopg

    q = _ALT_SQL[name]
    env = h.project_env(url, DJANGO_SETTINGS_MODULE=settings_module)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(q["reset"])
        logs = [open(h.out_dir() / f"{name}-worker-{i}.log", "w") for i in range(procs)]
        workers = [
            subprocess.Popen(
                _alt_worker_cmd(name, concurrency), cwd=h.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            for log in logs
        ]
        try:
            _wait_for(lambda: conn.execute(q["ready"]).fetchone()[0] >= procs, 60, f"{name} workers to start")  # type: ignore[index]
            done = subprocess.run(
                [h.PYTHON, "-m", "bench.compare.alt_enqueue", name, str(jobs)],
                cwd=h.ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            enqueued = json.loads(done.stdout.strip().splitlines()[-1])
            _wait_for(lambda: conn.execute(q["left"]).fetchone()[0] == 0, 600, f"{name} to drain")  # type: ignore[index]
            succeeded, first, last = conn.execute(q["span"]).fetchone()  # type: ignore[misc]
        finally:
            for w in workers:
                h.stop(w)
            for log in logs:
                log.close()
    if succeeded != jobs:
        raise RuntimeError(f"{name}: {succeeded} of {jobs} jobs succeeded")
    return jobs / (last - first).total_seconds(), enqueued["n"] / enqueued["seconds"]


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)
