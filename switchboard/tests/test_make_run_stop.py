"""Ctrl-C on `make run` stops everything it started: the web server, the reaper and the embedded
PostgreSQL. Run as a newcomer would, on a fresh clone (as test_readme.py does), and stopped as a terminal
stops it: SIGINT to make's whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from switchboard.tests.conftest import ROOT
from switchboard.tests.test_readme import _free_port, _wait_for, newcomer_env

pytestmark = pytest.mark.slow


def _processes_of(clone: Path) -> list[tuple[int, str]]:
    """Every live process started from the clone: run in it (make, web, reaper) or serving its data
    (postgres), as (pid, command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            zombie = ") Z " in (proc / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not zombie and (cwd == str(clone) or cwd.startswith(f"{clone}/") or str(clone) in cmdline):
            found.append((int(proc.name), cmdline))
    return found


def test_ctrl_c_on_make_run_leaves_no_process_and_no_database_running(tmp_path):
    clone = tmp_path / "switchboard"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
    port = _free_port()
    log = tmp_path / "make-run.log"
    with log.open("w") as out:
        service = subprocess.Popen(
            ["make", "-o", ".venv/.installed", "run", f"PORT={port}"],
            cwd=clone,
            env={**newcomer_env(), "GUNICORN_WORKERS": "2"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make leads its own process group, as in a terminal
        )
    try:
        _wait_for(port, service, log)
        # The first request imports and connects: slow on a loaded machine.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=90) as response:
            assert response.status == 200
        assert (clone / ".pgdata" / "postmaster.pid").exists()
        os.killpg(service.pid, signal.SIGINT)  # Ctrl-C
        service.wait(timeout=60)
        deadline = time.monotonic() + 10
        while (left := _processes_of(clone)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running after Ctrl-C: {left}\n{log.read_text()[-3000:]}"
        assert not (clone / ".pgdata" / "postmaster.pid").exists()
    finally:
        for pid, cmdline in _processes_of(clone):
            try:  # PostgreSQL: its fast shutdown, so that it cleans up after itself
                os.kill(pid, signal.SIGINT if "postgres" in cmdline.split()[0] else signal.SIGKILL)
            except ProcessLookupError:
                pass


USE_EMBEDDED = """
import os, sys, time
import django
django.setup()
from django.db import connection
connection.ensure_connection()
print("ready", flush=True)
if sys.argv[1] == "stay":
    time.sleep(300)
"""


def test_the_last_process_to_exit_stops_the_embedded_server_even_after_one_was_killed(tmp_path):
    # A web worker that gunicorn SIGKILLs (past its graceful timeout) never runs its exit handlers.
    env = {
        **newcomer_env(),
        "DJANGO_SETTINGS_MODULE": "switchboard.settings_test",
        "EMBEDDED_PG_DATA": str(tmp_path / "pgdata"),
        "EMBEDDED_PG_DATABASE": "switchboard",
    }
    pidfile = tmp_path / "pgdata" / "postmaster.pid"

    def start(mode: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", USE_EMBEDDED, mode], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    killed = start("stay")
    try:
        killed.kill()
        killed.communicate(timeout=10)
        assert pidfile.exists()
        last = start("exit")  # uses the same server, then exits normally: its last user
        last.communicate(timeout=60)
        assert last.returncode == 0
        deadline = time.monotonic() + 15
        while pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pidfile.exists(), "the embedded server outlived every process that used it"
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.communicate(timeout=10)
        if pidfile.exists():
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGINT)
