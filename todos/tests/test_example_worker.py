"""examples/worker.py (the Python client's worker runtime) against a live server: it works todos off,
fails on a crash, and a SIGTERM mid-handler releases the lease in hand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from todos import queue
from todos.longpoll import waiters
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "examples" / "worker.py"


def _start(live_server, agent, handler: str, *extra: str) -> subprocess.Popen:
    url = getattr(live_server, "url", None) or live_server.base
    # The client from this checkout, installed or not.
    path = os.pathsep.join(filter(None, [str(ROOT / "clients" / "python" / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "SWITCHBOARD_URL": url, "SWITCHBOARD_TOKEN": agent.token, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, str(WORKER), "--queues", "w.*", "--handler", handler, "--wait", "1", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_until(predicate, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    # A long-poll the worker had in flight still waits on the server after the worker is gone (and
    # would claim the next test's todo): let it run out first.
    _wait_until(lambda: not waiters._waiters, timeout=10)
    return out


def test_worker_completes_todos_and_fails_on_a_crash(live_server, agent):
    ok = [queue.create(queue="w.ok", payload={"n": i})[0] for i in range(3)]
    proc = _start(live_server, agent, "echo")
    try:
        _wait_until(lambda: Todo.objects.filter(state=TodoState.DONE).count() == 3)
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, out
    for todo in ok:
        todo.refresh_from_db()
        assert todo.result == todo.payload and todo.owner.startswith("alice/")

    crashing, _ = queue.create(queue="w.crash")
    proc = _start(live_server, agent, "crash")
    try:
        _wait_until(lambda: Todo.objects.filter(pk=crashing.pk, state=TodoState.FAILED).exists())
    finally:
        _stop(proc)
    crashing.refresh_from_db()
    assert "RuntimeError: demo crash" in crashing.errors[-1]["error"]


def test_sigterm_releases_the_lease_in_hand(live_server, agent):
    todo, _ = queue.create(queue="w.slow")
    proc = _start(live_server, agent, "sleep:30", "--lease", "5")
    try:
        _wait_until(lambda: Todo.objects.filter(pk=todo.pk, state=TodoState.CLAIMED).exists())
    finally:
        started = time.monotonic()
        out = _stop(proc)
    assert proc.returncode == 0, out
    assert time.monotonic() - started < 5
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0 and todo.lease_id is None
    assert "released" in out


def test_heartbeats_keep_a_short_lease_alive_through_a_longer_handler(live_server, agent):
    todo, _ = queue.create(queue="w.long")
    proc = _start(live_server, agent, "sleep:2.5", "--lease", "1")
    try:
        _wait_until(lambda: Todo.objects.filter(pk=todo.pk, state=TodoState.DONE).exists())
    finally:
        _stop(proc)
    todo.refresh_from_db()
    # Never lapsed: one receive, no "lease expired" entry.
    assert todo.attempt == 1 and todo.errors == [] and todo.result == {"slept": 2.5}


def test_sigterm_during_a_long_poll_releases_what_the_poll_brings_back(start_server, agent):
    # On the shipped server (gunicorn + uvicorn): the worker hangs up its long-poll at once, and the
    # server releases whatever that claim takes for a caller who has left.
    server = start_server()
    proc = _start(server, agent, "sleep:30", "--wait", "5")
    try:
        _wait_until(lambda: server.claim_statements() >= 1)
        proc.send_signal(signal.SIGTERM)
        # Created while the stopping worker's claim may still wait on the server: whoever takes it
        # must hand it straight back rather than let its lease lapse.
        todo, _ = queue.create(queue="w.late")
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    time.sleep(1)  # the server notices the hang-up within its wake
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0 and todo.lease_id is None, out


def test_sigterm_mid_long_poll_exits_long_before_the_poll_would_end(live_server, agent):
    proc = _start(live_server, agent, "echo", "--wait", "10")
    try:
        _wait_until(lambda: len(waiters._waiters) == 1)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    # The request is aborted, not waited out: well inside the 10 s the server would have held it.
    assert took < 5, out
    # The live server's thread does not notice the hang-up; let its wait run out before the next test.
    _wait_until(lambda: not waiters._waiters, timeout=15)


def test_drain_exits_once_the_queues_are_empty(live_server, agent):
    todos = [queue.create(queue="w.drain", payload={"n": i})[0] for i in range(2)]
    proc = _start(live_server, agent, "echo", "--wait", "0", "--drain")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert Todo.objects.filter(pk__in=[t.pk for t in todos], state=TodoState.DONE).count() == 2


def test_a_claim_refused_by_the_server_stops_the_worker_with_the_reason(live_server, make_agent):
    narrow = make_agent("narrow", claim=["other"])
    proc = _start(live_server, narrow, "echo")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "403" in out and "forbidden" in out
