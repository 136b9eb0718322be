"""The in-process worker (todos/worker.py, manage.py work): batched claims ahead of free handlers, batched
completes, each fenced by its receipt; a bounded prefetch released before its lease matters; SIGTERM
drains; a process killed mid-batch leaves its todos to lapse and run again, none lost or done twice."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models.functions import Now

from todos import queue
from todos.models import Agent, Todo, TodoState
from todos.tests.test_reap_leases import _reaper_env
from todos.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

BASE_DIR = Path(__file__).resolve().parents[2]


def wait_until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_concurrency_8_over_300_todos_runs_each_exactly_once_in_batches(agent: Agent) -> None:
    ids = {t.id for t, _ in queue.create_many([{"queue": "many", "payload": {"n": i}} for i in range(300)])}
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def handle(todo: Todo) -> Any:
        with lock:
            runs[todo.id] += 1
        return {"double": todo.payload["n"] * 2}

    stats = Worker(agent, handle, queues=["many"], concurrency=8, drain=True).run()
    assert set(runs) == ids and set(runs.values()) == {1}
    assert (stats.claimed, stats.completed, stats.lost, stats.released) == (300, 300, 0, 0)
    rows = Todo.objects.filter(pk__in=ids)
    assert rows.filter(state=TodoState.DONE, attempt=1).count() == 300
    assert all(t.result == {"double": t.payload["n"] * 2} for t in rows)


def test_a_failing_handler_fails_its_todo_and_a_retry_due_at_once_runs_again(agent: Agent) -> None:
    later = queue.create(queue="fails", kind="later")[0]
    again = queue.create(queue="fails", kind="again", max_attempts=3)[0]
    seen: list[str] = []

    class Later(Exception):
        retry_in = 3600

    def handle(todo: Todo) -> Any:
        seen.append(todo.kind)
        if todo.kind == "later":
            raise Later("not yet")
        if todo.attempt == 1:
            raise RuntimeError("flaky")  # backoff from 1 s base: retried within the drain's looks or not
        return "second time"

    stats = Worker(agent, handle, queues=["fails"], concurrency=2, drain=True).run()
    later.refresh_from_db()
    assert later.state == TodoState.FAILED and "Later: not yet" in later.errors[-1]["error"]
    assert later.next_retry_at is not None and stats.failed >= 2
    again.refresh_from_db()
    assert again.errors[0]["error"] == "RuntimeError: flaky"


def test_prefetch_is_bounded_and_released_before_its_lease_matters(agent: Agent) -> None:
    ids = [t.id for t, _ in queue.create_many([{"queue": "ahead"} for _ in range(20)])]
    gate = threading.Event()
    started: list[str] = []

    def handle(todo: Todo) -> Any:
        started.append(todo.id)
        assert gate.wait(30)
        return None

    worker = Worker(agent, handle, queues=["ahead"], concurrency=2, prefetch=3, lease_seconds=1.5, drain=True)
    thread = start(worker)
    try:
        wait_until(lambda: len(started) == 2)
        # Two running and three ahead: never more claimed at once.
        for _ in range(10):
            assert Todo.objects.filter(pk__in=ids, state=TodoState.CLAIMED).count() <= 5
            time.sleep(0.05)
        # The three ahead were not started within a third of the lease (0.5 s): given back, attempt and all.
        wait_until(lambda: worker.stats.released >= 3)
        time.sleep(1.6)  # past the running two's first lease: their heartbeats kept it
        running = Todo.objects.filter(pk__in=started)
        assert running.filter(state=TodoState.CLAIMED, lease_expires_at__gt=Now()).count() == 2
    finally:
        gate.set()
        thread.join(60)
    assert not thread.is_alive()
    rows = Todo.objects.filter(pk__in=ids)
    # Every todo done once; none lapsed (a lapse is an error entry and a second attempt).
    assert [t.errors for t in rows if t.errors] == []
    assert rows.filter(state=TodoState.DONE, attempt=1).count() == 20
    assert not any(t.errors for t in rows)
    assert worker.stats.completed == 20 and worker.stats.lost == 0


def test_a_lost_lease_is_not_completed(agent: Agent, make_agent: Callable[..., Agent]) -> None:
    todo = queue.create(queue="lost")[0]
    other = make_agent("bob")
    taken: dict[str, str] = {}

    def handle(claimed: Todo) -> Any:
        # Meanwhile the lease lapses (as if heartbeats had not got through) and another agent claims it.
        Todo.objects.filter(pk=claimed.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
        taken["lease"] = queue.claim(claimed.pk, agent=other).lease_id or ""
        return "too late"

    stats = Worker(agent, handle, queues=["lost"], drain=True).run()
    todo.refresh_from_db()
    assert todo.state == TodoState.CLAIMED and todo.lease_id == taken["lease"] and todo.result is None
    assert (stats.completed, stats.lost) == (0, 1)


def test_queues_outside_the_agents_scopes_stop_the_worker(make_agent: Callable[..., Agent]) -> None:
    narrow = make_agent("narrow", claim=["mine.*"])
    worker = Worker(narrow, lambda t: None, queues=["theirs"], drain=True)
    worker.run()
    assert worker.error is not None and worker.stats.claimed == 0


HANDLER = """
import pathlib, time

def handle(todo):
    pathlib.Path(f"started-{todo.payload['n']}").touch()
    time.sleep(todo.payload["sleep"])
    return {"n": todo.payload["n"]}
"""


def _work(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "work_handlers.py").write_text(textwrap.dedent(HANDLER))
    env = _reaper_env()
    env["PYTHONPATH"] = str(tmp_path)
    command = [sys.executable, str(BASE_DIR / "manage.py"), "work", "--agent", "alice"]
    return subprocess.Popen(
        [*command, "--handler", "work_handlers:handle", "--queue", "proc", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_manage_work_sigterm_finishes_running_handlers_and_releases_the_prefetch(agent: Agent, tmp_path: Path) -> None:
    ids = [queue.create(queue="proc", payload={"n": i, "sleep": 1.0})[0].id for i in range(12)]
    proc = _work(tmp_path, "--concurrency", "4", "--prefetch", "4", "--grace", "10")
    try:
        wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 4)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    rows = Todo.objects.filter(pk__in=ids)
    # The four running finished; the four ahead given back unstarted (attempt 0); the rest untouched.
    assert rows.filter(state=TodoState.DONE).count() == 4, out
    assert rows.filter(state=TodoState.PENDING, attempt=0).count() == 8, out
    assert "released=4" in out


def test_manage_work_killed_mid_batch_loses_nothing_and_does_nothing_twice(agent: Agent, tmp_path: Path) -> None:
    ids = [queue.create(queue="proc", payload={"n": i, "sleep": 0.05})[0].id for i in range(120)]
    proc = _work(tmp_path, "--concurrency", "8", "--lease", "2")
    try:
        wait_until(lambda: Todo.objects.filter(state=TodoState.DONE).count() >= 20)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    time.sleep(0.5)  # a commit it sent before it died lands first
    held = set(Todo.objects.filter(state=TodoState.CLAIMED).values_list("pk", flat=True))
    assert held, "the batch finished before the kill: nothing was tested"
    done_before = set(Todo.objects.filter(state=TodoState.DONE).values_list("pk", flat=True))
    # What the dead process held lapses (2 s) and is claimed again by the next one, which drains the rest.
    wait_until(lambda: not Todo.objects.filter(state=TodoState.CLAIMED, lease_expires_at__gt=Now()).exists())
    proc = _work(tmp_path, "--concurrency", "8", "--lease", "2", "--drain")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    rows = Todo.objects.filter(pk__in=ids)
    assert rows.filter(state=TodoState.DONE).count() == 120
    assert all(t.result == {"n": t.payload["n"]} for t in rows)
    # Done before the kill: once (attempt 1). Held at the kill: run again after the lapse (attempt 2).
    assert all(t.attempt == 1 for t in rows if t.pk in done_before)
    assert all(t.attempt == 2 for t in rows if t.pk in held)
