"""Poison message drill: a todo whose handler always crashes the worker ends dead-lettered after
max_attempts, with its error history; so does one whose handler always raises.

Two parts. In-process (needs only todos/queue/): forked workers claim the todo and die with
SIGKILL, the reaper (queue.reap_once, as `manage.py reap_leases` runs it) sweeps the lapsed lease.
Over HTTP (needs the API and examples/worker.py): the reference worker with a crashing handler,
restarted by the drill as a supervisor would, beside a real `reap_leases` sidecar.

    python -m bench.drills.poison [--max-attempts 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time
from typing import Any

from bench import harness as h
from bench.drills import common as c

QUEUE = "drill-poison"
LEASE = 1.0


def _crashing_worker(worker: str) -> None:
    from todos import queue
    from todos.models import Agent

    agent = Agent.objects.get(name="drill")
    if queue.claim_next(agent=agent, queues=[QUEUE], lease_seconds=LEASE, worker=worker):
        os.kill(os.getpid(), signal.SIGKILL)  # the handler takes the whole worker down


def in_process_crash(max_attempts: int) -> None:
    from django.db import connections

    from todos import queue
    from todos.models import Todo

    todo, _ = queue.create(queue=QUEUE, title="poison: crashes the worker", max_attempts=max_attempts)
    crashes = 0
    for attempt in range(max_attempts + 2):
        connections.close_all()
        proc = mp.get_context("fork").Process(target=_crashing_worker, args=(f"w{attempt}",))
        proc.start()
        proc.join()
        crashes += proc.exitcode == -signal.SIGKILL
        time.sleep(LEASE + 0.2)
        queue.reap_once(batch=100)
        todo.refresh_from_db()
        if todo.is_dead_letter:
            break
    todo.refresh_from_db()
    c.figure(
        f"in-process, crashing handler: {crashes} worker crashes; state {todo.state}, attempt "
        f"{todo.attempt}/{todo.max_attempts}, errors {[e['error'] for e in todo.errors]}"
    )
    c.check(todo.is_dead_letter, "the crashing todo is dead-lettered (failed, no retry scheduled)")
    c.check(crashes == max_attempts and todo.attempt == max_attempts, f"it was tried exactly {max_attempts} times")
    c.check(
        len(todo.errors) == max_attempts and all(e["error"] == "lease expired" for e in todo.errors),
        "its error history has one 'lease expired' per attempt",
    )
    agent = _agent()
    c.check(not queue.claim_next(agent=agent, queues=[QUEUE]), "a dead-letter is never handed out again")
    Todo.objects.filter(pk=todo.pk).delete()


def in_process_raise(max_attempts: int) -> None:
    from todos import queue

    agent = _agent()
    todo, _ = queue.create(queue=QUEUE, title="poison: handler raises", max_attempts=max_attempts)
    for _ in range(max_attempts + 2):
        claimed = queue.claim_next(agent=agent, queues=[QUEUE], lease_seconds=30)
        if not claimed:
            break
        try:
            raise RuntimeError(f"poison todo {claimed[0].id}: handler always raises")
        except RuntimeError as exc:
            queue.fail(claimed[0].id, agent=agent, lease_id=claimed[0].lease_id, error=str(exc), retry_in_seconds=0)
        time.sleep(0.05)
    todo.refresh_from_db()
    c.figure(
        f"in-process, raising handler: state {todo.state}, attempt {todo.attempt}/{todo.max_attempts}, "
        f"{len(todo.errors)} errors"
    )
    c.check(todo.is_dead_letter and todo.attempt == max_attempts, f"dead-lettered after {max_attempts} attempts")
    c.check(
        len(todo.errors) == max_attempts and all("always raises" in e["error"] for e in todo.errors),
        "each attempt's exception is in its error history",
    )


def _agent() -> Any:
    from todos.models import Agent

    return Agent.objects.get(name="drill")


def over_http(db: c.DrillDb, token: str, max_attempts: int) -> None:
    c.require_worker()
    from todos import queue
    from todos.models import Todo

    env = {"QUEUE_DEFAULT_LEASE_SECONDS": "2", "QUEUE_RETRY_BASE_SECONDS": "0.2", "QUEUE_RETRY_CAP_SECONDS": "1"}
    with db.gunicorn(**env) as base, h.reaper(db.url, interval=0.5, log_name="drill-reaper"):
        c.require_api(base, token)
        api = h.Api(base, token)
        log = h.out_dir() / "drill-poison-workers.log"
        for handler, expect in (("crash", "lease expired"), ("boom", "always raises")):
            # A queue per handler: a stopped worker's long-poll may still be waiting on the server
            # and would claim (and lose) a todo created in its queue meanwhile.
            todo_queue = f"{QUEUE}-{handler}"
            todo, _ = queue.create(queue=todo_queue, title=f"poison over HTTP: {handler}", max_attempts=max_attempts)
            argv = c.worker_argv(base, token, todo_queue, f"bench.drills.handlers:{handler}", lease=2)
            proc, crashes = c.start_worker(argv, log), 0
            deadline = time.monotonic() + 120
            try:
                while time.monotonic() < deadline:
                    todo.refresh_from_db()
                    if todo.is_dead_letter:
                        break
                    if proc.poll() is not None:  # a supervisor restarts the crashed worker
                        crashes += 1
                        proc = c.start_worker(argv, log)
                    time.sleep(0.2)
            finally:
                h.stop(proc)
            todo.refresh_from_db()
            status, body = api.get(f"/api/v1/todos/{todo.id}/")
            errors = [e.get("error", "") for e in todo.errors]
            c.figure(
                f"over HTTP, handler {handler}: {crashes} worker restarts; state {todo.state}, attempt "
                f"{todo.attempt}/{todo.max_attempts}; errors {errors}"
            )
            c.check(todo.is_dead_letter, f"[{handler}] dead-lettered")
            c.check(
                todo.attempt == max_attempts and len(errors) == max_attempts, f"[{handler}] after {max_attempts} tries"
            )
            c.check(all(expect in e for e in errors), f"[{handler}] every attempt's error is recorded ({expect!r})")
            c.check(status == 200 and body.get("state") == "failed", f"[{handler}] the API shows it failed")
            Todo.objects.filter(pk=todo.pk).delete()


def drill(max_attempts: int, http: bool) -> None:
    db = c.DrillDb("poison")
    _, token = db.agent()
    in_process_crash(max_attempts)
    in_process_raise(max_attempts)
    if http:
        over_http(db, token, max_attempts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--in-process-only", action="store_true")
    args = parser.parse_args()
    c.run_drill("poison", lambda: drill(args.max_attempts, not args.in_process_only))


if __name__ == "__main__":
    main()
