"""The worker runtime's throughput machinery against the shipped server (issue 32): a bounded prefetch
released before its lease matters, more than one claim in flight, the long-poll only after an empty
answer, completions sent at once, and ``--processes N`` (each its own slots; SIGTERM drains all; a
child killed mid-batch leaves its todos to lapse and run again, none lost, none done twice)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from django.db.models.functions import Now
from switchboard_client import AsyncClient, Client, Worker

from todos import queue
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def wait_until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=lambda: asyncio.run(worker.arun()), daemon=True)
    thread.start()
    return thread


class Recorder:
    """Every request the worker sends: (start, end, path, body), by patching AsyncClient.send (the real
    request still goes to the real server); ``claim_delay`` holds each claim's answer that long."""

    def __init__(self, monkeypatch, claim_delay: float = 0.0) -> None:
        self.calls: list[tuple[float, float, str, object]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        send = AsyncClient.send
        recorder = self

        async def recorded(client, call):
            began = time.monotonic()
            claim = call.path == "todos/claim/"
            if claim:
                recorder.in_flight += 1
                recorder.most_in_flight = max(recorder.most_in_flight, recorder.in_flight)
            try:
                result = await send(client, call)
                if claim and claim_delay:
                    await asyncio.sleep(claim_delay)
                return result
            finally:
                if claim:
                    recorder.in_flight -= 1
                recorder.calls.append((began, time.monotonic(), call.path, call.body))

        monkeypatch.setattr(AsyncClient, "send", recorded)

    def claims(self) -> list[dict]:
        return [body for _, _, path, body in sorted(self.calls) if path == "todos/claim/"]


def test_prefetch_is_bounded_and_released_before_its_lease_matters(server, agent, monkeypatch):
    ids = [queue.create(queue="ahead", kind="k")[0].id for _ in range(20)]
    gate = threading.Event()
    started: list[str] = []
    worker = Worker(
        Client(server.base, agent.token), queues=["ahead"], concurrency=2, prefetch=2, lease_seconds=3, drain=True
    )

    @worker.handler("k")
    def handle(todo):
        started.append(todo.id)
        assert gate.wait(30)

    thread = start(worker)
    try:
        began = time.monotonic()
        wait_until(lambda: len(started) == 2)
        # Two running and two ahead (claimed, not started), in two claims of half the bound: no more.
        wait_until(lambda: worker.stats.claimed == 4)
        for _ in range(10):
            assert Todo.objects.filter(pk__in=ids, state=TodoState.CLAIMED).count() <= 4
            time.sleep(0.05)
        # Not started within a third of the lease (1 s): the two ahead are given back, and no more are
        # claimed ahead while the handlers stay busy.
        wait_until(lambda: worker.stats.released >= 2)
        time.sleep(max(0.0, 3.3 - (time.monotonic() - began)))  # past the first lease: heartbeats kept it
        assert [t.errors for t in Todo.objects.filter(pk__in=ids) if t.errors] == []
        assert worker.stats.released == 2 and worker.stats.claimed == 4
        assert Todo.objects.filter(pk__in=ids, state=TodoState.CLAIMED).count() == 2
        assert Todo.objects.filter(pk__in=started, state=TodoState.CLAIMED, lease_expires_at__gt=Now()).count() == 2
    finally:
        gate.set()
        thread.join(60)
    rows = Todo.objects.filter(pk__in=ids)
    # Every todo done once; none lapsed (a lapse is an error entry and a second attempt).
    assert [t.errors for t in rows if t.errors] == []
    assert rows.filter(state=TodoState.DONE, attempt=1).count() == 20
    assert worker.stats.completed == 20 and worker.stats.lost == 0


def test_two_claims_in_flight_and_the_long_poll_only_after_an_empty_answer(server, agent, monkeypatch):
    for i in range(60):
        queue.create(queue="flight", kind="k", payload={"n": i})
    recorder = Recorder(monkeypatch, claim_delay=0.05)  # answers slow enough for claims to overlap
    worker = Worker(Client(server.base, agent.token), queues=["flight"], concurrency=4, prefetch=4, poll_seconds=2)
    worker.add_handler("k", lambda todo: None)
    thread = start(worker)
    try:
        wait_until(lambda: worker.stats.completed == 60)
        wait_until(lambda: any(c.get("wait_seconds") for c in recorder.claims()))
    finally:
        worker.stop()
        thread.join(20)
    claims = recorder.claims()
    assert recorder.most_in_flight == 2  # more than one claim on its way, never more than claims_in_flight
    assert all(c["limit"] <= 4 for c in claims)  # each a share of concurrency + prefetch (8) over two claims
    # Plain claims while they found work; the first long-poll only once the queue was empty.
    first_poll = next(i for i, c in enumerate(claims) if c.get("wait_seconds"))
    assert first_poll > 0 and claims[first_poll]["wait_seconds"] == 2
    assert all("wait_seconds" not in c for c in claims[:first_poll])
    assert worker.stats.completed == 60 and worker.stats.claimed == 60


def test_a_completion_is_sent_at_once_when_nothing_else_is_on_its_way(server, agent, monkeypatch):
    todos = [queue.create(queue="flush", kind="k", payload={"sleep": s})[0] for s in (0.0, 0.4, 0.8)]
    recorder = Recorder(monkeypatch)
    returned: dict[str, float] = {}
    worker = Worker(Client(server.base, agent.token), queues=["flush"], concurrency=3, drain=True)

    @worker.handler("k")
    async def handle(todo):
        await asyncio.sleep(todo.payload["sleep"])
        returned[todo.id] = time.monotonic()

    asyncio.run(worker.arun())
    completes = [(began, body) for began, _, path, body in recorder.calls if path == "todos/complete/"]
    # One batch per handler (they finish apart), each sent as its handler returned: no wait for company.
    assert len(completes) == 3
    for todo in todos:
        sent = next(began for began, body in completes if body["items"][0]["id"] == todo.id)
        assert 0 <= sent - returned[todo.id] < 0.05
    assert Todo.objects.filter(queue="flush", state=TodoState.DONE).count() == 3


HANDLERS = """
import os, pathlib, time

def handle(todo):
    pathlib.Path(f"started-{todo.payload['n']}").write_text(str(os.getpid()))
    time.sleep(todo.payload["sleep"])
    return {"n": todo.payload["n"], "pid": os.getpid()}

handlers = {"p": handle}
"""


def _processes(tmp_path, env, *args):
    (tmp_path / "multi_handlers.py").write_text(textwrap.dedent(HANDLERS))
    return subprocess.Popen(
        [sys.executable, "-m", "switchboard_client", "worker", "multi_handlers", "--json", "--queues", "multi", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_share_the_queue_each_with_its_own_slots(server, env, tmp_path):
    ids = [queue.create(queue="multi", kind="p", payload={"n": i, "sleep": 0.02})[0].id for i in range(200)]
    proc = _processes(tmp_path, env, "--processes", "2", "--concurrency", "4", "--poll", "1", "--drain")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stats = [json.loads(line) for line in out.splitlines()]
    assert len(stats) == 2 and sum(s["completed"] for s in stats) == 200, out
    rows = Todo.objects.filter(pk__in=ids)
    assert rows.filter(state=TodoState.DONE, attempt=1).count() == 200
    assert len({t.result["pid"] for t in rows}) == 2  # both processes ran some
    assert len({t.owner for t in rows}) == 2


def test_sigterm_drains_every_process(server, env, tmp_path):
    ids = [queue.create(queue="multi", kind="p", payload={"n": i, "sleep": 1.5})[0].id for i in range(4)]
    proc = _processes(tmp_path, env, "--processes", "2", "--concurrency", "2", "--prefetch", "0", "--grace", "10")
    try:
        wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 4)
        late = queue.create(queue="multi", kind="p", payload={"n": 9, "sleep": 0})[0]  # not claimed after the stop
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 6
    assert len({p.read_text() for p in tmp_path.glob("started-*")}) == 2  # both processes ran handlers
    assert Todo.objects.filter(pk__in=ids, state=TodoState.DONE).count() == 4, err
    late.refresh_from_db()
    assert late.state == TodoState.PENDING and late.attempt == 0


def test_a_process_killed_mid_batch_leaves_its_todos_to_lapse_and_run_again(server, env, tmp_path):
    ids = [queue.create(queue="multi", kind="p", payload={"n": i, "sleep": 0.05})[0].id for i in range(150)]
    proc = _processes(tmp_path, env, "--processes", "2", "--concurrency", "4", "--lease", "2", "--poll", "1")
    try:
        wait_until(lambda: len({p.read_text() for p in tmp_path.glob("started-*")}) == 2)
        wait_until(lambda: Todo.objects.filter(state=TodoState.DONE).count() >= 20)
        victim = int(next(tmp_path.glob("started-*")).read_text())
        subprocess.run(["kill", "-KILL", str(victim)], check=True)  # one child, mid-batch
        time.sleep(0.5)  # what it sent before it died lands first
        theirs = Todo.objects.filter(state=TodoState.CLAIMED, owner__endswith=f"-{victim}")
        held = set(theirs.values_list("pk", flat=True))
        # The survivor drains the rest, and the dead one's todos once their leases lapse.
        wait_until(lambda: Todo.objects.filter(pk__in=ids, state=TodoState.DONE).count() == 150, timeout=90)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    rows = Todo.objects.filter(pk__in=ids)
    assert all(t.result == {"n": t.payload["n"], "pid": t.result["pid"]} for t in rows)
    assert held, "the killed process held nothing: nothing was tested"
    # What it held ran again after the lapse (attempt 2, by the survivor), but for a completion it had
    # sent as it died and the server committed after the snapshot (attempt 1, its own result: done
    # once). Nothing else ran twice.
    again = [t for t in rows if t.pk in held and t.attempt == 2]
    assert again and all(t.result["pid"] != victim for t in again)
    assert all(t.attempt == 1 and t.result["pid"] == victim for t in rows if t.pk in held and t.attempt != 2)
    assert {t.attempt for t in rows if t.pk not in held} == {1}


def test_the_processes_stop_when_their_parent_is_killed(env, tmp_path):
    # Nothing answers at this address: the children keep retrying their claim until told to stop.
    proc = _processes(tmp_path, {**env, "SWITCHBOARD_URL": "http://127.0.0.1:9"}, "--processes", "2")
    children_file = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    try:
        ours = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        wait_until(lambda: len(children_file.read_text().split()) == 2, timeout=30)
        children = [int(c) for c in children_file.read_text().split()]
        wait_until(lambda: all(Path(f"/proc/{c}/cmdline").read_bytes() != ours for c in children), timeout=30)
        proc.kill()  # SIGKILL: it forwards nothing
        proc.communicate(timeout=10)
        # Each child is sent SIGTERM as its parent dies (PR_SET_PDEATHSIG), and drains and exits.
        wait_until(lambda: not any(Path(f"/proc/{c}").exists() for c in children), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
