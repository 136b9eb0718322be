"""Queue controls under real concurrency: claimers on their own PostgreSQL connections (threads) or in
their own OS processes, all against one queue's controls in the database. Issue 11's tests."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections, transaction
from django.db.models.functions import Now

from todos import controls, longpoll, queue
from todos.errors import TodoConflict
from todos.longpoll import listener, waiters
from todos.models import Agent, Todo, TodoState
from todos.tests.test_api_longpoll import Http
from todos.tests.test_concurrency import run_together, seed
from todos.tests.test_reap_leases import BASE_DIR, _reaper_env

pytestmark = pytest.mark.django_db(transaction=True)


def _live_leases(queue_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM todos_todo WHERE queue = %s AND state = 'claimed' AND lease_expires_at >= now()",
            [queue_name],
        )
        return int(cursor.fetchone()[0])


def test_sixteen_claimers_on_a_queue_limited_to_three_never_hold_more_than_three(agent):
    created = seed("capped", 96)
    controls.set_limits("capped", max_claimed=3)
    history: list[tuple[float, int]] = []  # (monotonic time, +1 claimed / -1 about to complete)
    seen_in_rows: list[int] = []
    lock = threading.Lock()

    def claimer() -> list[str]:
        got: list[str] = []
        idle = 0
        while idle < 20:
            todos = queue.claim_next(agent=agent, queues=["capped"], limit=2)
            if not todos:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            # Recorded after the claim committed and before the complete starts: each recorded interval
            # lies inside the lease's real one, so an overlap of more than 3 here is one in the database.
            with lock:
                history.extend((time.monotonic(), +1) for _ in todos)
            seen = _live_leases("capped")
            with lock:
                seen_in_rows.append(seen)
            time.sleep(0.01)  # hold the leases a moment, so that the claimers overlap
            for todo in todos:
                with lock:
                    history.append((time.monotonic(), -1))
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
                got.append(todo.id)
        return got

    per_thread = run_together([claimer] * 16)
    claimed = [i for ids in per_thread for i in ids]
    assert sorted(claimed) == sorted(created), "every todo claimed exactly once"
    assert seen_in_rows and max(seen_in_rows) <= 3
    held = peak = 0
    for _, delta in sorted(history):
        held += delta
        peak = max(peak, held)
    assert peak <= 3
    assert peak == 3, "the claimers never filled the cap: the test would not catch an overshoot"
    assert Todo.objects.filter(state=TodoState.DONE).count() == 96


def test_ten_seconds_at_20_per_second_burst_5_make_at_most_205_claims_and_nearly_that_many(agent):
    seed("rated", 400)
    listener._ensure_running()
    assert listener.connected.wait(5)
    started = time.monotonic()  # before the bucket exists: the window covers all its tokens
    controls.set_limits("rated", rate_per_second=20, rate_burst=5)
    deadline = started + 10.0
    stamps: list[float] = []
    lock = threading.Lock()

    def claimer() -> None:
        while (left := deadline - time.monotonic()) > 0:
            # A long-poll: refused by the rate, it sleeps until the next token is due (selectors).
            todos = async_to_sync(longpoll.claim_next_waiting)(
                agent=agent, queues=["rated"], limit=5, wait_seconds=min(left, 2)
            )
            now = time.monotonic()
            if now <= deadline:
                with lock:
                    stamps.extend(now for _ in todos)
            for todo in todos:
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)

    run_together([claimer] * 4)
    assert len(stamps) <= 20 * 10 + 5
    assert len(stamps) >= 0.9 * (20 * 10 + 5), f"only {len(stamps)} claims while work was waiting"
    # No second held more than a burst beyond its rate.
    for t in stamps:
        assert sum(1 for s in stamps if t <= s < t + 1.0) <= 20 + 5 + 1


def test_a_claimer_of_two_limited_queues_never_deadlocks_with_one_of_the_reverse_order(make_agent):
    seed("lim.a", 60)
    seed("lim.b", 60)
    controls.set_limits("lim.a", max_claimed=50)
    controls.set_limits("lim.b", rate_per_second=10_000, rate_burst=1000)
    agents = [make_agent(f"w{i}", claim=["lim.*"]) for i in range(2)]

    def drain(a: Agent, order: list[str]) -> int:
        n = 0
        while todos := queue.claim_next(agent=a, queues=order, limit=3):
            n += len(todos)
            for todo in todos:
                queue.complete(todo.id, agent=a, lease_id=todo.lease_id)
        return n

    done = run_together(
        [lambda a=a, o=o: drain(a, o) for a in agents for o in (["lim.a", "lim.b"], ["lim.b", "lim.a"])]
    )
    assert sum(done) == 120


# --- pause across processes ------------------------------------------------------------------------

CLAIMER = """
import os, time
from todos import queue
from todos.models import Agent
agent = Agent.objects.get(name=os.environ["CLAIMER_AGENT"])
deadline = time.monotonic() + float(os.environ["CLAIMER_SECONDS"])
print("ready", flush=True)
while time.monotonic() < deadline:
    for todo in queue.claim_next(agent=agent, queues=["paused.q"]):
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
    time.sleep(0.01)
"""


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _done() -> int:
    return Todo.objects.filter(queue="paused.q", state=TodoState.DONE).count()


def test_pause_stops_claims_in_every_process_by_their_next_claim_and_resume_restarts_them(agent):
    seed("paused.q", 2000)
    env = {**_reaper_env(), "CLAIMER_AGENT": agent.name, "CLAIMER_SECONDS": "40"}
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "--no-imports", "-c", CLAIMER],
            cwd=BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "a claimer did not start"
        _wait_until(lambda: _done() >= 20, 20, "the claimers to get going")
        controls.pause("paused.q")
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            paused_at = cursor.fetchone()[0]
        time.sleep(1.0)
        # A claim whose transaction began after the pause committed took nothing, in any process.
        assert not Todo.objects.filter(queue="paused.q", claimed_at__gt=paused_at).exists()
        assert not Todo.objects.filter(queue="paused.q", state=TodoState.CLAIMED).exists()
        frozen = _done()
        time.sleep(1.0)
        assert _done() == frozen
        assert all(proc.poll() is None for proc in procs), "a claimer died"

        controls.resume("paused.q")
        _wait_until(lambda: _done() >= frozen + 20, 20, "claims to start again")
        claimers = set(Todo.objects.filter(queue="paused.q", claimed_at__gt=paused_at).values_list("owner", flat=True))
        assert claimers == {agent.name}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


def test_resume_wakes_a_long_poll_waiting_on_the_paused_queue(live_server, agent):
    listener._ensure_running()
    assert listener.connected.wait(5)
    todo, _ = queue.create(queue="jobs.p")
    controls.pause("jobs.p")
    client = Http(live_server.url, agent.token)
    out: dict = {}

    def wait() -> None:
        response = client.post("/todos/claim/", {"queues": ["jobs.p"], "wait_seconds": 15})
        out["answered"] = time.monotonic()
        out["todos"] = response.json()["todos"]

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        _wait_until(lambda: len(waiters._waiters) >= 1, 5, "the request to wait")
        time.sleep(1.0)
        assert thread.is_alive(), "a paused queue handed out its todo"
        resumed = time.monotonic()
        controls.resume("jobs.p")
        thread.join(10)
        assert not thread.is_alive()
        assert [t["id"] for t in out["todos"]] == [todo.id]
        # Woken by resume's NOTIFY: with nothing due, the waiter would otherwise sleep out its 15 s.
        assert out["answered"] - resumed < 5
    finally:
        thread.join(20)
        client.close()


def test_resume_wakes_as_many_long_polls_as_the_queue_has_todos(agent):
    # One notification wakes one waiter (todos/longpoll.py), so resume says how many todos it freed.
    listener._ensure_running()
    assert listener.connected.wait(5)
    created = {queue.create(queue="jobs.p2", title=str(i))[0].id for i in range(2)}
    controls.pause("jobs.p2")
    answered: list[tuple[float, list[str]]] = []
    lock = threading.Lock()

    def wait() -> None:
        try:
            todos = async_to_sync(longpoll.claim_next_waiting)(agent=agent, queues=["jobs.p2"], wait_seconds=15)
            with lock:
                answered.append((time.monotonic(), [t.id for t in todos]))
        finally:
            connections.close_all()  # this thread's connection, opened by the claims

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        _wait_until(lambda: len(waiters._waiters) >= 2, 5, "both claims to wait")
        time.sleep(0.5)
        assert not answered, "a paused queue handed out a todo"
        resumed = time.monotonic()
        controls.resume("jobs.p2")
        for thread in threads:
            thread.join(10)
        assert sorted(i for _, ids in answered for i in ids) == sorted(created)
        assert all(at - resumed < 5 for at, _ in answered), "a waiter slept on after resume"
    finally:
        for thread in threads:
            thread.join(20)


def test_a_create_never_waits_for_a_claim_writing_its_queues_token_bucket(agent):
    # A rate-limited queue's claims update its todos_queue row; the registering trigger (migration 0014)
    # reads before it inserts, so a create into the queue does not queue up behind that write.
    queue.create(queue="rated.w")
    controls.set_limits("rated.w", rate_per_second=5)
    holding = threading.Event()
    release = threading.Event()

    def claim_and_hold() -> None:
        with transaction.atomic():
            assert queue.claim_next(agent=agent, queues=["rated.w"])  # wrote the bucket, row locked
            holding.set()
            release.wait(10)

    def create_meanwhile() -> bool:
        holding.wait(10)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")
            return queue.create(queue="rated.w", title="lands")[1]
        finally:
            release.set()

    _, created = run_together([claim_and_hold, create_meanwhile])
    assert created is True


def test_heartbeats_taking_back_lapsed_leases_and_claims_together_never_pass_max_claimed(agent):
    # Eight lapsed leases whose workers heartbeat, and eight claimers of fresh todos, all at once, on a
    # queue capped at three: whoever wins, the queue never holds more than three live leases.
    seed("capped", 8)
    controls.set_limits("capped", max_claimed=8)
    lapsed = queue.claim_next(agent=agent, queues=["capped"], limit=8)
    Todo.objects.filter(pk__in=[t.id for t in lapsed]).update(lease_expires_at=Now() - timedelta(seconds=1))
    seed("capped", 8)
    controls.set_limits("capped", max_claimed=3)

    def heartbeat(todo: Todo) -> Callable[[], int]:
        def run() -> int:
            try:
                queue.heartbeat(todo.id, agent=agent, lease_id=todo.lease_id, lease_seconds=60)
                return 1
            except TodoConflict:
                return 0
            finally:
                connections.close_all()

        return run

    def claimer() -> int:
        try:
            return len(queue.claim_next(agent=agent, queues=["capped"], lease_seconds=60))
        finally:
            connections.close_all()

    taken = run_together([heartbeat(t) for t in lapsed] + [claimer] * 8)
    assert sum(taken) == 3
    assert _live_leases("capped") == 3
