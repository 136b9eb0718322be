"""The workers' doors (issue 32): the in-process worker (manage.py work) claims with an agent's claim scopes
and nothing beyond them; ``switchboard worker --processes N`` hands its children the token by the
environment, never on a command line that every user of the machine can read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from todos import queue
from todos.models import Agent, Todo, TodoState
from todos.worker import Worker

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db(transaction=True)
def test_the_in_process_worker_claims_only_within_its_agents_claim_scopes(make_agent: Callable[..., Agent]) -> None:
    narrow = make_agent("narrow", claim=["mine.*"])
    mine = queue.create(queue="mine.a")[0]
    theirs = queue.create(queue="theirs")[0]
    seen: list[str] = []
    stats = Worker(narrow, lambda todo: seen.append(todo.id), drain=True).run()
    assert seen == [mine.id] and stats.completed == 1
    theirs.refresh_from_db()
    assert theirs.state == TodoState.PENDING and theirs.attempt == 0


@pytest.mark.django_db(transaction=True)
def test_the_in_process_worker_asked_for_queues_beyond_its_scopes_claims_nothing(
    make_agent: Callable[..., Agent],
) -> None:
    narrow = make_agent("narrow", claim=["mine.*"])
    theirs = queue.create(queue="theirs")[0]
    worker = Worker(narrow, lambda todo: None, queues=["mine.*", "theirs"], drain=True)
    worker.run()
    assert worker.error is not None and worker.error.code == "forbidden" and worker.stats.claimed == 0
    # A glob wider than its scopes is narrowed to them, as over HTTP: theirs stays untouched.
    Worker(narrow, lambda todo: None, queues=["*"], drain=True).run()
    assert Todo.objects.get(pk=theirs.pk).state == TodoState.PENDING


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_worker_processes_get_the_token_by_environment_not_on_their_command_line(tmp_path: Path) -> None:
    token = "sb_secret_token_for_this_test"
    (tmp_path / "idle_handlers.py").write_text("handlers = {'*': lambda todo: None}\n")
    env = {
        **os.environ,
        "SWITCHBOARD_TOKEN": token,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "clients" / "python" / "src"), str(tmp_path)]),
    }
    # An address nothing answers on: the children keep retrying their claim, alive long enough to read.
    env["SWITCHBOARD_URL"] = "http://127.0.0.1:9"
    command = [sys.executable, "-m", "switchboard_client", "worker", "idle_handlers"]
    proc = subprocess.Popen(
        [*command, "--processes", "2"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while len(children := _children(proc.pid)) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the children did not start"
            time.sleep(0.05)
        ours = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        for child in children:
            # Until its exec a forked child shows this process's command line: wait for its own.
            while (cmdline := Path(f"/proc/{child}/cmdline").read_bytes()) == ours:
                assert time.monotonic() < deadline, "the child did not start"
                time.sleep(0.02)
            assert token.encode() not in cmdline and b"--token" not in cmdline
            assert b"--processes" not in cmdline  # a child runs the worker itself, it does not fork more
        proc.send_signal(signal.SIGTERM)  # passed on to each child (which may still be starting)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # It waited for its children: none is left running.
    assert not any(Path(f"/proc/{child}").exists() for child in children)
