"""Long-poll claims, concurrency and database loss, through a live HTTP server."""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest
import requests
from asgiref.sync import async_to_sync
from django.db import connection, connections

from todos import controls, longpoll, queue
from todos.limits import LONG_POLL_IDLE_SPREAD
from todos.longpoll import listener, waiters
from todos.models import Todo, TodoState
from todos.tests.conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)


class Http:
    """A keep-alive HTTP client for one agent against the live server."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base + "/api/v1"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def post(self, path: str, body: dict | None = None, timeout: float = 30) -> requests.Response:
        return self.session.post(self.base + path, json=body or {}, timeout=timeout)

    def get(self, path: str) -> requests.Response:
        return self.session.get(self.base + path, timeout=30)

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def http(live_server, agent):
    client = Http(live_server.url, agent.token)
    yield client
    client.close()


@pytest.fixture
def listening():
    listener._ensure_running()
    assert listener.connected.wait(5), "the listener did not connect"


def _claim_in_thread(client: Http, body: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        started = time.monotonic()
        response = client.post("/todos/claim/", body)
        out["answered"] = time.monotonic()
        out["elapsed"] = out["answered"] - started
        out["status"] = response.status_code
        out["todos"] = response.json()["todos"]

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _wait_for_waiters(n: int, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while len(waiters._waiters) < n:
        assert time.monotonic() < deadline, "the request never started waiting"
        time.sleep(0.01)


def test_long_poll_on_a_key_capped_queue_returns_when_the_key_holder_completes(http, listening, agent):
    """Issue 22: the queue's only claimable todo is behind a key at max_claimed_per_key. A complete frees the
    slot without a NOTIFY; the waiter re-polls with backoff (as at max_claimed) rather than sleeping out its
    wait."""
    first, _ = queue.create(queue="jobs.keyed", fair_key="pr-1")
    behind, _ = queue.create(queue="jobs.keyed", fair_key="pr-1")
    queue.create(queue="jobs.keyed", fair_key="pr-2")
    controls.set_limits("jobs.keyed", max_claimed_per_key=1)
    held = queue.claim_next(agent=agent, queues=["jobs.keyed"], limit=2)
    assert sorted(t.fair_key for t in held) == ["pr-1", "pr-2"]
    holder = next(t for t in held if t.id == first.id)
    thread, out = _claim_in_thread(http, {"queues": ["jobs.keyed"], "wait_seconds": 20})
    _wait_for_waiters(1)
    time.sleep(1.5)
    assert thread.is_alive(), "a second lease of key pr-1 was handed out"
    completed = time.monotonic()
    assert holder.lease_id is not None
    queue.complete(holder.id, agent=agent, lease_id=holder.lease_id)
    thread.join(10)
    assert not thread.is_alive(), "the long-poll slept on with a claimable todo"
    assert out["status"] == 200
    assert [t["id"] for t in out["todos"]] == [behind.id]
    assert out["answered"] - completed < 3


def test_long_poll_wakes_when_a_matching_todo_is_created(http, listening):
    thread, out = _claim_in_thread(http, {"queues": ["jobs.*"], "wait_seconds": 10})
    _wait_for_waiters(1)
    time.sleep(0.2)
    created, _ = queue.create(queue="jobs.a")
    thread.join(15)
    assert out["status"] == 200 and [t["id"] for t in out["todos"]] == [created.id]
    assert out["elapsed"] < 2
    created.refresh_from_db()
    assert created.state == TodoState.CLAIMED and created.owner == "alice"


def test_long_poll_is_not_woken_by_a_todo_in_another_queue(http, listening):
    before = waiters.wakes
    thread, out = _claim_in_thread(http, {"queues": ["jobs.*"], "wait_seconds": 1.5})
    _wait_for_waiters(1)
    other, _ = queue.create(queue="mail.x")
    thread.join(10)
    assert out["status"] == 200 and out["todos"] == []
    assert out["elapsed"] >= 1.5 * (1 - LONG_POLL_IDLE_SPREAD) - 0.05
    assert waiters.wakes == before  # the NOTIFY for mail.x woke nobody
    other.refresh_from_db()
    assert other.state == TodoState.PENDING


def test_an_assignee_waiting_behind_ten_other_agents_gets_its_todo_at_once(live_server, listening, make_agent):
    others = [Http(live_server.url, make_agent(f"other{i}").token) for i in range(10)]
    bob = make_agent("bob")
    bob_http = Http(live_server.url, bob.token)
    try:
        polls = [_claim_in_thread(client, {"queues": ["assigned"], "wait_seconds": 6}) for client in others]
        _wait_for_waiters(10)
        time.sleep(0.2)  # each has made its first claim and sleeps
        thread, out = _claim_in_thread(bob_http, {"queues": ["assigned"], "wait_seconds": 6})
        _wait_for_waiters(11)
        time.sleep(0.2)
        created, _ = queue.create(queue="assigned", assignee="bob")
        made_at = time.monotonic()
        thread.join(10)
        # The NOTIFY names only the queue: it woke the longest waiter, whose claim found nothing for its
        # agent, and was handed on, agent by agent, to bob.
        assert [t["id"] for t in out["todos"]] == [created.id]
        assert out["answered"] - made_at < 1.5
        for other_thread, other in polls:
            other_thread.join(10)
            assert other["todos"] == []
    finally:
        for client in [*others, bob_http]:
            client.close()


def test_long_poll_wakes_when_a_lease_lapses_without_any_write(http, listening, make_agent):
    crashed = make_agent("crashed", claim=["jobs.*"])
    todo, _ = queue.create(queue="jobs.b")
    queue.claim_next(agent=crashed, lease_seconds=1)
    claimed_at = time.monotonic()
    thread, out = _claim_in_thread(http, {"queues": ["jobs.*"], "wait_seconds": 10})
    thread.join(15)
    assert [t["id"] for t in out["todos"]] == [todo.id]
    # Answered once the lease lapsed (about 1 s after the claim), long before the 10 s wait ran out.
    assert 0.9 < out["answered"] - claimed_at < 4
    todo.refresh_from_db()
    assert todo.owner == "alice" and todo.attempt == 2 and todo.errors[-1]["error"] == "lease expired"


def test_long_poll_wakes_when_a_scheduled_retry_comes_due(http, listening, agent):
    todo, _ = queue.create(queue="jobs.c")
    [claimed] = queue.claim_next(agent=agent)
    queue.fail(todo.id, agent=agent, lease_id=claimed.lease_id, error="x", retry_in_seconds=1)
    failed_at = time.monotonic()
    response = http.post("/todos/claim/", {"wait_seconds": 10})
    assert [t["id"] for t in response.json()["todos"]] == [todo.id]
    assert 0.9 < time.monotonic() - failed_at < 4


def test_a_lapse_wakes_one_of_many_waiters_who_share_one_read_of_when_it_comes(http, listening, make_agent):
    crashed = make_agent("crashed", claim=["herd.*"])
    todo, _ = queue.create(queue="herd.a")
    queue.claim_next(agent=crashed, lease_seconds=1.5)
    reads, claims = waiters.due_reads, waiters.claims
    polls = [_claim_in_thread(http, {"queues": ["herd.*"], "wait_seconds": 4}) for _ in range(4)]
    for thread, _ in polls:
        thread.join(15)
    outs = [out for _, out in polls]
    assert sorted(len(out["todos"]) for out in outs) == [0, 0, 0, 1]
    # One read of when the lease lapses serves the four (two if one came late), and one after the
    # lapse; the lapse made one waiter claim, and the wake handed on by the one that got it one more.
    assert waiters.due_reads - reads <= 3
    assert waiters.claims - claims <= 4 + 2
    assert all(out["elapsed"] >= 4 * (1 - LONG_POLL_IDLE_SPREAD) - 0.1 for out in outs if not out["todos"])
    todo.refresh_from_db()
    assert todo.owner == "alice"


def test_a_waiting_request_makes_no_queries_while_nothing_arrives(agent, listening, django_assert_num_queries):
    # Through the test client (same thread, so its queries are counted): the token lookup, one claim,
    # one read of the next lapse or retry, then silence: no last claim at the deadline.
    api = Api(agent.token)
    started = time.monotonic()
    with django_assert_num_queries(3):
        response = api.post("/todos/claim/", {"wait_seconds": 1.5})
    assert response.json() == {"todos": []} and time.monotonic() - started >= 1.5 * (1 - LONG_POLL_IDLE_SPREAD) - 0.05


def test_eight_concurrent_clients_drain_500_todos_each_exactly_once(live_server, agent):
    made = {queue.create(queue="drain", title=str(i))[0].id for i in range(500)}
    done: list[str] = []
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        client = Http(live_server.url, agent.token)
        try:
            barrier.wait()
            while True:
                todos = client.post("/todos/claim/", {"limit": 5, "lease_seconds": 60}).json()["todos"]
                if not todos:
                    return
                items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in todos]
                for outcome in client.post("/todos/complete/", {"items": items}).json()["outcomes"]:
                    (done if outcome["status"] == 200 else errors).append(outcome["id"])
        finally:
            client.close()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert Counter(done).most_common(1)[0][1] == 1
    assert set(done) == made
    assert Todo.objects.filter(state=TodoState.DONE).count() == 500


def test_single_completes_from_concurrent_clients_each_succeed_once(live_server, agent):
    made = {queue.create(queue="drain1")[0].id for _ in range(60)}
    done: list[str] = []

    def work() -> None:
        client = Http(live_server.url, agent.token)
        try:
            while todos := client.post("/todos/claim/", {}).json()["todos"]:
                response = client.post(f"/todos/{todos[0]['id']}/complete/", {"lease_id": todos[0]["lease_id"]})
                assert response.status_code == 200
                done.append(todos[0]["id"])
        finally:
            client.close()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == sorted(made)


def _terminate_other_backends() -> int:
    params = listener._connection_params()
    with psycopg.connect(**params, autocommit=True) as conn:
        pids = [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        # pg_terminate_backend only signals (timeout 0: no waiting inside it); wait until each backend has
        # exited, i.e. sent its FATAL and closed, as after a real restart. Until then a client socket looks
        # quiet and the cheap health check (switchboard/db) would rightly take it as usable.
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [pids])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            (alive,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone()
            if not alive:
                break
            time.sleep(0.01)
    return len(pids)


def test_a_lost_connection_mid_request_answers_503_unavailable(agent):
    api = Api(agent.token)
    assert api.get("/queues/").status_code == 200
    pid = connection.cursor().connection.info.backend_pid
    with psycopg.connect(**listener._connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    try:
        # The test client skips the request-start health check, so the dead connection is used.
        response = api.get("/queues/")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "unavailable"
        assert response.headers["Retry-After"] == "1"
    finally:
        connection.close()
    assert api.get("/queues/").status_code == 200


def test_the_server_recovers_by_itself_after_its_connections_are_terminated(http, listening):
    assert http.get("/queues/").status_code == 200
    assert _terminate_other_backends() >= 1
    connections.close_all()
    # The live server's connection is dead: the request-start health check (CONN_HEALTH_CHECKS)
    # reconnects, and the request succeeds.
    assert http.get("/queues/").status_code == 200
    # The listener reconnects too, and long-polls are woken by NOTIFY again.
    assert listener.connected.wait(10)
    thread, out = _claim_in_thread(http, {"wait_seconds": 10})
    _wait_for_waiters(1)
    created, _ = queue.create(queue="after.restart")
    thread.join(15)
    assert [t["id"] for t in out["todos"]] == [created.id]


def test_a_body_over_the_default_limit_is_too_large_over_real_http(http):
    response = http.post("/todos/", {"queue": "big", "payload": {"blob": "x" * (1024 * 1024 + 1)}})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert not Todo.objects.exists()


def test_a_woken_waiter_whose_client_hung_up_claims_nothing(agent, listening):
    out: dict = {}

    def wait() -> None:
        try:

            async def gone() -> bool:
                return True

            out["todos"] = async_to_sync(longpoll.claim_next_waiting)(
                agent=agent, queues=["gone.*"], wait_seconds=10, client_gone=gone
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_for_waiters(1)
    time.sleep(0.3)  # past its first claim (made before it can know of any hang-up), into the wait
    todo, _ = queue.create(queue="gone.a")
    thread.join(15)
    assert out["todos"] == []
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0


def test_idle_polls_that_began_together_answer_spread_over_the_last_tenth_of_their_wait(http, listening):
    # A crowd that began together (a deploy, a reconnect storm) must not re-poll as one burst each cycle.
    polls = [_claim_in_thread(http, {"queues": ["quiet.*"], "wait_seconds": 3}) for _ in range(8)]
    for thread, _ in polls:
        thread.join(15)
    elapsed = sorted(out["elapsed"] for _, out in polls)
    assert all(out["status"] == 200 and out["todos"] == [] for _, out in polls)
    assert 3 * (1 - LONG_POLL_IDLE_SPREAD) - 0.1 <= elapsed[0] and elapsed[-1] <= 3 + 1, elapsed
    assert elapsed[-1] - elapsed[0] > 0.03, elapsed  # uniform over 0.3 s: eight within 30 ms is ~1e-6
