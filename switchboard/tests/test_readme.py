"""The README's "first ten minutes", run as written on a fresh clone, so the README cannot drift.

The repository is cloned into a temporary folder (its committed state, as a newcomer gets it), the
shared virtualenv is linked in instead of installed (make is told not to remake it), and the first
fenced block (`make run`) starts the service in the background on a free port. The second block then
runs in one bash, in order, with `set -euo pipefail`: any failing command (a curl answering 4xx/5xx,
a crashing manage.py) fails the test. The only edits are the port, and make's `-o .venv/.installed`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from switchboard.tests.conftest import ROOT

pytestmark = pytest.mark.slow

SECTION = "## The first ten minutes"
FENCE = re.compile(r"```sh\n(.*?)```", re.S)


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return FENCE.findall(text[start:end])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_run_here(block: str, port: int) -> str:
    # The shared virtualenv is already installed: make must not pip install into it.
    block = re.sub(r"\bmake (\w+)", r"make -o .venv/.installed \1", block)
    return block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def newcomer_env() -> dict[str, str]:
    """A newcomer's shell: none of the test run's settings (its key, hosts, database) leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "SECRET", "ALLOWED", "DATABASE"))}
    env = {
        k: v
        for k, v in env.items()
        if k not in ("ENV_FILE", "SECURE_SSL_REDIRECT", "EMBEDDED_PG_DATA", "EMBEDDED_PG_DATABASE")
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(GUNICORN_WORKERS="1", GUNICORN_THREADS="4")
    return env


def _wait_for(url_port: int, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"make run exited early:\n{log.read_text()[-3000:]}"
        try:
            with socket.create_connection(("127.0.0.1", url_port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"make run never listened:\n{log.read_text()[-3000:]}")


def test_the_readme_blocks_are_what_this_test_runs():
    run, commands = readme_blocks()
    assert run.strip() == "make run"
    assert "make superuser" in commands and "create_agent" in commands and "examples/worker.py" in commands
    assert "/ingest/" in commands


def test_the_first_ten_minutes_run_as_written_on_a_fresh_clone(tmp_path):
    run, commands = readme_blocks()
    clone = tmp_path / "switchboard"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
    port = _free_port()
    env = newcomer_env()
    log = tmp_path / "make-run.log"
    with log.open("w") as out:
        service = subprocess.Popen(
            ["bash", "-c", _as_run_here(run, port).strip() + f" PORT={port}"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(port, service, log)
        script = "set -euo pipefail\n" + _as_run_here(commands, port)
        result = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr and '"error"' not in result.stdout, result.stdout + result.stderr
        assert '"duplicate":false' in result.stdout.replace(" ", "")  # the webhook was stored
        assert "me/my-repo#7: Fix the docs" in result.stdout  # the route's todo, listed
        banner = log.read_text()
        assert f"http://127.0.0.1:{port}/api/v1/" in banner
        assert (clone / ".env").exists() and "DEBUG=true" in (clone / ".env").read_text()
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGTERM)
            try:
                service.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
                service.wait(timeout=10)
        # The clone's embedded server stops with its last process; make sure nothing lingers.
        pidfile = clone / ".pgdata" / "postmaster.pid"
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGINT)  # PostgreSQL's fast shutdown
            except (ProcessLookupError, ValueError):
                pass
