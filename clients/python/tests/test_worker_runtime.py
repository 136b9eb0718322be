"""The worker runtime against the shipped server: many todos at concurrency 8 done once each, heartbeats
through a slow handler, a lost lease not completed, SIGKILL losing nothing, SIGTERM draining in its
grace."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from switchboard_client import AsyncClient, Client, Fail, Release, Wait, Worker

from todos import queue
from todos.errors import TodoConflict
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def wait_until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=lambda: asyncio.run(worker.arun()), daemon=True)
    thread.start()
    return thread


def test_concurrency_8_over_500_todos_runs_each_exactly_once(server, agent):
    ids = {queue.create(queue="many", kind="n", payload={"n": i})[0].id for i in range(500)}
    runs = collections.Counter()
    lock = threading.Lock()
    worker = Worker(Client(server.base, agent.token), queues=["many"], concurrency=8, lease_seconds=30, drain=True)

    @worker.handler("n")
    def handle(todo):
        with lock:
            runs[todo.id] += 1
        return {"double": todo.payload["n"] * 2}

    stats = asyncio.run(worker.arun())
    assert set(runs) == ids and set(runs.values()) == {1}
    assert stats.completed == 500 and stats.lost == 0
    rows = Todo.objects.filter(pk__in=ids)
    assert rows.filter(state=TodoState.DONE, attempt=1).count() == 500
    assert all(t.result == {"double": t.payload["n"] * 2} for t in rows)


def test_async_handlers_fail_with_retry_in_and_release(server, agent):
    ok = queue.create(queue="kinds", kind="ok", payload={"x": 1})[0]
    bad = queue.create(queue="kinds", kind="bad")[0]
    back = queue.create(queue="kinds", kind="back")[0]
    worker = Worker(Client(server.base, agent.token), queues=["kinds"], concurrency=4, drain=True)
    released = []

    @worker.handler("ok")
    async def ok_(todo):
        await asyncio.sleep(0.01)
        return todo.payload

    @worker.handler("bad")
    def bad_(todo):
        raise Fail("not yet", retry_in=3600)

    @worker.handler("back")
    def back_(todo):
        released.append(todo.id)
        if len(released) == 1:
            raise Release
        return "second time"

    stats = asyncio.run(worker.arun())
    ok.refresh_from_db(), bad.refresh_from_db(), back.refresh_from_db()
    assert ok.state == TodoState.DONE and ok.result == {"x": 1}
    assert bad.state == TodoState.FAILED and "Fail: not yet" in bad.errors[-1]["error"]
    assert bad.next_retry_at is not None
    # Released (attempt given back), then claimed again by the same worker and done.
    assert released == [back.id, back.id] and back.state == TodoState.DONE and back.attempt == 1
    assert (stats.completed, stats.failed, stats.released) == (2, 1, 1)


def test_a_handler_slower_than_its_lease_is_kept_alive_by_heartbeats(server, agent):
    todo = queue.create(queue="slow", kind="s")[0]
    worker = Worker(Client(server.base, agent.token), queues=["slow"], lease_seconds=1, drain=True)

    @worker.handler("s")
    def slow(todo):
        time.sleep(3)
        return "slept"

    stats = asyncio.run(worker.arun())
    todo.refresh_from_db()
    # Never lapsed: one receive, no "lease expired" entry, and the result sent.
    assert todo.state == TodoState.DONE and todo.attempt == 1 and todo.errors == [] and todo.result == "slept"
    assert stats.lost == 0


def test_a_lost_lease_is_told_to_the_handler_and_not_completed(server, agent, make_agent):
    todo = queue.create(queue="lost", kind="l")[0]
    other = make_agent("bob")
    seen = {}
    worker = Worker(Client(server.base, agent.token), queues=["lost"], lease_seconds=1.5, poll_seconds=1)

    @worker.handler("l")
    def handle(todo, ctx):
        seen["lost"] = ctx.wait_lost(20)
        seen["state"] = ctx.lost_state
        return "too late"

    thread = start(worker)
    try:
        wait_until(lambda: Todo.objects.filter(pk=todo.pk, state=TodoState.CLAIMED).exists())
        # The lease lapses (as if heartbeats had not got through) and another agent claims the todo.
        # A heartbeat landing between the two statements renews the lease: lapse it again and retry.
        theirs = None
        for _ in range(50):
            Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
            try:
                theirs = queue.claim(todo.pk, agent=other)
                break
            except TodoConflict:
                time.sleep(0.02)
        assert theirs is not None
        wait_until(lambda: "lost" in seen)
        time.sleep(0.3)  # time enough for an outcome to be sent, were it sent
    finally:
        worker.stop()
        thread.join(20)
    assert seen == {"lost": True, "state": "claimed"}
    todo.refresh_from_db()
    assert todo.state == TodoState.CLAIMED and todo.lease_id == theirs.lease_id and todo.result is None
    assert worker.stats.lost == 1 and worker.stats.completed == 0


def test_a_handler_reports_progress_and_its_checkpoint_resumes_the_next_attempt(server, agent):
    todo = queue.create(queue="ckpt", kind="c", max_attempts=3)[0]
    seen: list[tuple[object, object]] = []
    progress_seen = threading.Event()
    # A long lease: only the handler's own reports (sent at once) reach the server during the test.
    client = Client(server.base, agent.token)
    worker = Worker(client, queues=["ckpt"], lease_seconds=300, poll_seconds=1, drain=True)

    @worker.handler("c")
    def handle(todo, ctx):
        seen.append((ctx.saved, todo.checkpoint))
        if ctx.saved is None:
            ctx.progress(40, "first pages", now=True)
            assert progress_seen.wait(20)
            ctx.checkpoint({"page": 7})  # sent at once by default; before the failure in any case
            raise Fail("crashed mid-way", retry_in=0)
        ctx.progress(100, "done")  # rides the next heartbeat: none comes before the completion
        return {"resumed_from": ctx.saved["page"]}

    def watch() -> None:
        wait_until(lambda: (client.get(todo.pk).progress or {}).get("percent") == 40, timeout=30)
        progress_seen.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with client:
        stats = asyncio.run(worker.arun())
        watcher.join(5)
    todo.refresh_from_db()
    assert seen == [(None, None), ({"page": 7}, {"page": 7})]
    assert todo.state == TodoState.DONE and todo.result == {"resumed_from": 7} and todo.attempt == 2
    assert todo.progress["message"] == "first pages"
    assert (stats.failed, stats.completed) == (1, 1)


def test_a_handler_that_raises_wait_is_run_again_with_the_resolution(server, agent):
    todo = queue.create(queue="waits", kind="w")[0]
    waiting = []
    client = Client(server.base, agent.token)
    worker = Worker(client, queues=["waits"], poll_seconds=1)

    @worker.handler("w")
    def handle(todo):
        if todo.resolution is None:
            raise Wait(token=True, timeout_seconds=600, on_waiting=waiting.append)
        return {"approved_by": todo.resolution["data"]["by"]}

    thread = start(worker)
    try:
        wait_until(lambda: bool(waiting))
        assert Todo.objects.get(pk=todo.pk).state == TodoState.WAITING
        assert client.resolve_waitpoint(waiting[0].waitpoint.token, data={"by": "jo"}).resolved
        wait_until(lambda: Todo.objects.filter(pk=todo.pk, state=TodoState.DONE).exists())
    finally:
        worker.stop()
        thread.join(20)
        client.close()
    todo.refresh_from_db()
    assert todo.result == {"approved_by": "jo"} and todo.resolution["by"] == "token"
    assert (worker.stats.waited, worker.stats.completed, worker.stats.failed) == (1, 1, 0)


HANDLERS = """
import time
from switchboard_client import Worker

worker = Worker(queues=["proc"], concurrency={concurrency}, lease_seconds={lease}, poll_seconds=1,
                grace_seconds={grace})

@worker.handler("p")
def handle(todo):
    # A mark that this handler is running: a test that stops the worker mid-work waits for the handlers,
    # not for the claims (a claim is in the database before its answer reaches the worker).
    open(f"started-{{todo.payload['n']}}", "w").close()
    time.sleep(todo.payload["sleep"])
    return {{"n": todo.payload["n"]}}
"""


def _process(tmp_path, env, concurrency=8, lease=2.0, grace=10.0, *extra):
    (tmp_path / "proc_handlers.py").write_text(
        textwrap.dedent(HANDLERS.format(concurrency=concurrency, lease=lease, grace=grace))
    )
    return subprocess.Popen(
        [sys.executable, "-m", "switchboard_client", "worker", "proc_handlers", *extra],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_worker_sigkilled_mid_batch_loses_nothing(server, env, tmp_path):
    ids = [queue.create(queue="proc", kind="p", payload={"n": i, "sleep": 0.05})[0].id for i in range(120)]
    proc = _process(tmp_path, env)
    try:
        wait_until(lambda: Todo.objects.filter(state=TodoState.DONE).count() >= 20)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    left = Todo.objects.exclude(state=TodoState.DONE).count()
    assert left > 0, "the batch finished before the kill: nothing was tested"
    # A second worker picks up what the dead one held once its leases lapse (2 s), and the rest. It starts
    # after the lapse: a draining worker stops at its first empty claim, which on a loaded machine could
    # come before the lapse.
    wait_until(lambda: not Todo.objects.filter(state=TodoState.CLAIMED, lease_expires_at__gt=Now()).exists())
    proc = _process(tmp_path, env, 8, 2.0, 10.0, "--drain")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    rows = Todo.objects.filter(pk__in=ids)
    assert rows.filter(state=TodoState.DONE).count() == 120
    assert all(t.result == {"n": t.payload["n"]} for t in rows)


def test_sigterm_lets_running_handlers_finish_within_the_grace(server, env, tmp_path):
    ids = [queue.create(queue="proc", kind="p", payload={"n": i, "sleep": 1.5})[0].id for i in range(4)]
    proc = _process(tmp_path, env, 4, 10.0, 10.0)
    try:
        # The handlers running, not the rows claimed: a SIGTERM between the server's claim and its answer
        # rightly gives the todos back unstarted (the flake a fresh clone hit, issue 34).
        wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 4)
        queue.create(queue="proc", kind="p", payload={"n": 9, "sleep": 0})  # must not be claimed after the stop
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert time.monotonic() - started < 5
    assert Todo.objects.filter(pk__in=ids, state=TodoState.DONE).count() == 4, out
    assert Todo.objects.filter(payload__n=9, state=TodoState.PENDING, attempt=0).count() == 1


def test_sigterm_releases_what_the_grace_did_not_finish(server, env, tmp_path):
    todo = queue.create(queue="proc", kind="p", payload={"n": 1, "sleep": 60})[0]
    proc = _process(tmp_path, env, 1, 10.0, 0.5)
    try:
        wait_until(lambda: Todo.objects.filter(pk=todo.pk, state=TodoState.CLAIMED).exists())
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert time.monotonic() - started < 4
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0 and todo.lease_id is None


def test_a_claim_answered_as_the_stop_comes_is_given_back_not_left_to_lapse(server, agent, monkeypatch):
    # The server has claimed the todo and its answer is still on its way when the worker is told to stop
    # (the network's delay stood in for by a pause after the real round trip). Hanging up then would leave
    # the todo leased until it lapses; the worker takes the answer and releases it, starting nothing.
    todo = queue.create(queue="inflight", kind="n")[0]
    answered = threading.Event()
    send = AsyncClient.send

    async def slow_answer(self, call):
        result = await send(self, call)
        if call.path.startswith("todos/claim"):
            answered.set()
            await asyncio.sleep(0.3)
        return result

    monkeypatch.setattr(AsyncClient, "send", slow_answer)
    ran = []
    worker = Worker(Client(server.base, agent.token), queues=["inflight"], lease_seconds=60, poll_seconds=5)
    worker.add_handler("n", lambda t: ran.append(t.id))
    thread = start(worker)
    try:
        assert answered.wait(30)
        assert Todo.objects.filter(pk=todo.pk, state=TodoState.CLAIMED).exists()
    finally:
        worker.stop()
        thread.join(20)
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0 and todo.lease_id is None
    assert ran == [] and worker.stats.released == 1


def test_a_handler_creates_children_under_its_own_lease_three_levels_deep(server, agent):
    root = queue.create(queue="tree", kind="spawn", payload={"levels": 2})[0]
    client = Client(server.base, agent.token)

    def spawn(todo, ctx):
        if todo.payload["levels"]:
            ctx.create("tree", kind="spawn", payload={"levels": todo.payload["levels"] - 1})
        return {"depth": todo.depth}

    with client:
        # A draining worker stops when a claim finds nothing, and each level is created while the level
        # above runs: one run per level.
        for _ in range(3):
            worker = Worker(client, queues=["tree"], lease_seconds=60, poll_seconds=1, drain=True)
            worker.handler("spawn")(spawn)
            asyncio.run(worker.arun())
        nodes = [n.id for n in client.tree(root.pk).nodes]
    tree = {t.depth or 0: t for t in Todo.objects.filter(pk=root.pk) | Todo.objects.filter(root_id=root.pk)}
    assert sorted(tree) == [0, 1, 2] and {t.state for t in tree.values()} == {TodoState.DONE}
    assert tree[1].parent_id == root.pk and tree[2].parent_id == tree[1].pk and tree[2].root_id == root.pk
    assert nodes == [root.pk, tree[1].pk, tree[2].pk]
