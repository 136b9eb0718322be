"""manage.py reap_leases: one sweep with --once, and the loop as a real process that SIGTERM stops."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now

from todos.models import Todo, TodoState

BASE_DIR = Path(__file__).resolve().parents[2]
SWEEP_LINE = "reaper sweep requeued="


def _lapsed(make_todo: Callable[..., Todo], **overrides: object) -> Todo:
    fields = {"state": TodoState.CLAIMED, "attempt": 1, "owner": "gone", "lease_id": "ls_old"}
    fields.update(overrides)
    return make_todo("q", lease_expires_at=Now() - timedelta(seconds=1), **fields)


# The command closes stale connections before each sweep (as a long-running process must), which would
# end the rollback-only transaction of a plain django_db test: these commit for real.
@pytest.mark.django_db(transaction=True)
def test_reap_leases_once_sweeps_and_logs_the_counts(make_todo, caplog):
    below = _lapsed(make_todo)
    at_cap = _lapsed(make_todo, attempt=5)
    due = make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() - timedelta(seconds=1))
    live = make_todo("q", state=TodoState.CLAIMED, attempt=1, lease_expires_at=Now() + timedelta(minutes=5))
    with caplog.at_level(logging.INFO, logger="switchboard.reaper"):
        call_command("reap_leases", "--once", "--batch", "2")
    [line] = [r.getMessage() for r in caplog.records if r.name == "switchboard.reaper"]
    assert line.startswith("reaper sweep requeued=1 dead_lettered=1 retries_promoted=1 ")
    for todo in (below, at_cap, due, live):
        todo.refresh_from_db()
    assert below.state == TodoState.PENDING and below.errors[-1]["error"] == "lease expired"
    assert at_cap.is_dead_letter
    assert due.state == TodoState.PENDING and due.next_retry_at is None
    assert live.state == TodoState.CLAIMED


@pytest.mark.django_db(transaction=True)
def test_reap_leases_once_with_nothing_to_do_logs_nothing(make_todo, caplog):
    make_todo("q")
    with caplog.at_level(logging.INFO, logger="switchboard.reaper"):
        call_command("reap_leases", "--once")
    assert [r for r in caplog.records if r.name == "switchboard.reaper"] == []


def _reaper_env() -> dict[str, str]:
    """The test database, as a DATABASE_URL the subprocess's settings read (so it starts nothing embedded)."""
    db = connection.settings_dict
    host = db["HOST"] or db.get("OPTIONS", {}).get("host", "")
    auth = quote(db["USER"]) + (":" + quote(db["PASSWORD"]) if db["PASSWORD"] else "")
    if host.startswith("/"):  # a Unix socket directory (the embedded server)
        url = f"postgres://{auth}@/{quote(db['NAME'])}?host={quote(host)}"
    else:
        url = f"postgres://{auth}@{host}:{db['PORT'] or 5432}/{quote(db['NAME'])}"
    return {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
    }


def _start_reaper(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "reap_leases", *args],
        cwd=BASE_DIR,
        env=_reaper_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    """Make sure the process is gone and its pipe closed; return what it printed."""
    if proc.poll() is None:
        proc.kill()
    output, _ = proc.communicate(timeout=10)
    return output or ""


def _wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _state(todo: Todo) -> str:
    return Todo.objects.values_list("state", flat=True).get(pk=todo.pk)


@pytest.mark.django_db(transaction=True)
def test_reap_leases_loop_requeues_a_lapsed_lease_and_stops_on_sigterm(make_todo):
    first = _lapsed(make_todo)
    proc = _start_reaper("--interval", "0.2")
    try:
        # No claim runs: only the sidecar can move it.
        assert _wait_for(lambda: _state(first) == TodoState.PENDING, timeout=30), "the reaper never swept"
        # Several idle sweeps (0.2 s apart) go by, then one more lapse.
        time.sleep(1.0)
        second = _lapsed(make_todo)
        assert _wait_for(lambda: _state(second) == TodoState.PENDING, timeout=5)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=5)
        stopped_after = time.monotonic() - sent
    finally:
        output = _stop(proc)
    assert proc.returncode == 0, output
    # Promptly, not after a sweep interval; the bound is loose because a loaded CI machine is slow to spawn.
    assert stopped_after < 3.0, f"took {stopped_after:.2f}s to stop"
    # One line per sweep that did something, none for the idle ones.
    sweeps = [line for line in output.splitlines() if SWEEP_LINE in line]
    assert len(sweeps) == 2, output
    assert all("requeued=1 dead_lettered=0 retries_promoted=0" in line for line in sweeps)
    assert "reaper stopped" in output
    first.refresh_from_db()
    assert [e["error"] for e in first.errors] == ["lease expired"]


@pytest.mark.django_db(transaction=True)
def test_reap_leases_loop_stops_on_sigint_too(make_todo):
    proc = _start_reaper("--interval", "30")
    try:
        started = _wait_for(lambda: proc.poll() is not None or _started(proc), timeout=30)
        assert started and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        proc.wait(timeout=5)
        # Even in the middle of a 30 s sleep between sweeps (a bound well under the interval: a loaded
        # machine takes its time to deliver the signal and exit).
        assert time.monotonic() - sent < 5.0
    finally:
        output = _stop(proc)
    assert proc.returncode == 0, output


def _started(proc: subprocess.Popen[str]) -> bool:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return "reaper started" in line


@pytest.mark.django_db(transaction=True)
def test_reap_leases_loop_exits_non_zero_after_a_few_sweeps_that_cannot_work():
    # A batch PostgreSQL refuses (LIMIT -1) fails every sweep the same way: no retry can cure it.
    proc = _start_reaper("--interval", "0.05", "--batch", "-1")
    try:
        proc.wait(timeout=60)
    finally:
        output = _stop(proc)
    assert proc.returncode == 1, output
    failures = [line for line in output.splitlines() if "reaper sweep failed" in line]
    assert len(failures) == 3, output
    cause = "(broken): InvalidRowCountInLimitClause SQLSTATE 2201W: LIMIT must not be negative"
    assert all(cause in line for line in failures)
    assert "reaper stopped: 3 sweeps failed" in output


@pytest.mark.django_db(transaction=True)
def test_reap_leases_once_exits_non_zero_when_its_sweep_cannot_work():
    proc = _start_reaper("--once", "--batch", "-1")
    try:
        proc.wait(timeout=60)
    finally:
        output = _stop(proc)
    assert proc.returncode == 1, output
    assert "SQLSTATE 2201W" in output
