"""The queue under real parallelism: threads, each with its own PostgreSQL connection, started
together on a barrier. Every test commits for real (transaction=True), as production does."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from todos import queue
from todos.errors import TodoConflict
from todos.models import Agent, Queue, Todo, TodoState

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
THREAD_TIMEOUT = 120


def run_together(workers: list[Callable[[], T]]) -> list[T]:
    """Run each callable in its own thread, released at the same instant; return their results in
    order, re-raising the first exception a thread raised."""
    barrier = threading.Barrier(len(workers))
    results: list[Any] = [None] * len(workers)
    raised: list[BaseException] = []

    def run(i: int, work: Callable[[], T]) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work()
        except BaseException as exc:  # handed to the main thread, which re-raises it
            raised.append(exc)
        finally:
            # Each thread has its own connection; leaving it open would block the test database's flush.
            connection.close()

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_TIMEOUT)
        assert not thread.is_alive(), "a worker thread hung"
    if raised:
        raise raised[0]
    return results


def seed(queue_name: str, n: int, *, state_sql: str = "") -> list[str]:
    """Insert n todos in one statement (distinct, increasing created_at); return their ids.

    ``state_sql`` adds column assignments applied afterwards in SQL, e.g. a lapsed claim."""
    Queue.objects.get_or_create(name=queue_name)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at)
            SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), %s, '', 'k', 'seeded', '{}'::jsonb,
                   'pending', 0, 5, '[]'::jsonb, now() - interval '1 hour' + i * interval '1 millisecond', now(),
                   now() - interval '1 hour' + i * interval '1 millisecond'
            FROM generate_series(1, %s) AS i
            RETURNING id
            """,
            [queue_name, n],
        )
        ids = [row[0] for row in cursor.fetchall()]
        if state_sql:
            cursor.execute(f"UPDATE todos_todo SET {state_sql} WHERE id = ANY(%s)", [ids])
    return ids


def drain(agent: Agent, *, limit: int, queues: list[str] | None = None) -> Callable[[], list[str]]:
    """A claimer that claims until the queue gives it nothing, checking every batch's size."""

    def work() -> list[str]:
        got: list[str] = []
        while True:
            todos = queue.claim_next(agent=agent, queues=queues, limit=limit)
            assert len(todos) <= limit, f"asked for {limit}, got {len(todos)}"
            if not todos:
                return got
            got.extend(t.id for t in todos)

    return work


def assert_claimed_exactly_once(created: list[str], per_thread: list[list[str]]) -> None:
    claimed = [todo_id for ids in per_thread for todo_id in ids]
    twice = [todo_id for todo_id, n in Counter(claimed).items() if n > 1]
    assert not twice, f"{len(twice)} todos were claimed twice"
    assert set(claimed) == set(created), f"lost {len(set(created) - set(claimed))}"
    # Every row the database holds as claimed was handed to someone: no claim locked and updated a row
    # it did not return.
    in_db = Todo.objects.filter(state=TodoState.CLAIMED)
    assert set(in_db.values_list("id", flat=True)) == set(created)
    assert set(in_db.values_list("attempt", flat=True)) == {1}


@pytest.mark.parametrize("limit", [1, 10])
def test_claim_next_by_eight_claimers_claims_each_of_1000_todos_exactly_once(make_agent, limit):
    alice = make_agent("alice")
    created = seed("drain", 1000)
    per_thread = run_together([drain(alice, limit=limit) for _ in range(8)])
    assert_claimed_exactly_once(created, per_thread)
    # Real parallelism: more than one claimer got work.
    assert sum(1 for ids in per_thread if ids) > 1


@pytest.mark.parametrize("limit", [1, 10])
def test_claim_next_across_queues_with_a_glob_scope_claims_each_exactly_once(make_agent, limit):
    bot = make_agent("bot", claim=["jobs.*"])
    created = seed("jobs.a", 400) + seed("jobs.b", 350) + seed("jobs.c", 250)
    outside = seed("other", 100)
    per_thread = run_together([drain(bot, limit=limit) for _ in range(8)])
    assert_claimed_exactly_once(created, per_thread)
    assert Todo.objects.filter(id__in=outside, state=TodoState.PENDING).count() == 100


@pytest.mark.parametrize("limit", [3, 7])
def test_claim_next_batch_under_contention_never_takes_more_than_asked(make_agent, limit):
    bot = make_agent("bot", claim=["batch.*"])
    created = seed("batch.a", 200) + seed("batch.b", 200) + seed("batch.c", 200)
    # Half the claimers name the queues explicitly, half rely on the glob: both paths under contention.
    workers = [drain(bot, limit=limit, queues=["batch.a", "batch.b", "batch.c"] if i % 2 else None) for i in range(12)]
    per_thread = run_together(workers)
    assert_claimed_exactly_once(created, per_thread)


def test_create_twenty_at_once_with_one_key_makes_one_todo():
    def create() -> tuple[str, bool]:
        todo, created = queue.create(queue="hooks", idempotency_key="delivery-1", title="once")
        return todo.id, created

    outcomes = run_together([create for _ in range(20)])
    assert len({todo_id for todo_id, _ in outcomes}) == 1
    assert [created for _, created in outcomes].count(True) == 1
    assert Todo.objects.filter(queue="hooks", idempotency_key="delivery-1").count() == 1


def test_requeue_lapsed_by_two_reapers_over_5000_lapsed_leases_handles_each_once():
    lapsed = "state = 'claimed', owner = 'gone', lease_id = 'ls_old', lease_expires_at = now() - interval '1 minute'"
    below = seed("reap", 4000, state_sql=f"{lapsed}, attempt = 1")
    at_cap = seed("reap", 1000, state_sql=f"{lapsed}, attempt = 5")

    def reaper() -> tuple[int, int]:
        requeued = dead = 0
        while True:
            result = queue.requeue_lapsed(batch=100)
            requeued += result.requeued
            dead += result.dead_lettered
            if result.requeued + result.dead_lettered == 0:
                return requeued, dead

    counts = run_together([reaper, reaper])
    assert sum(r for r, _ in counts) == 4000
    assert sum(d for _, d in counts) == 1000
    expired = Counter()
    for todo_id, errors in Todo.objects.values_list("id", "errors"):
        expired[todo_id] = sum(1 for e in errors if e["error"] == "lease expired")
    assert set(expired.values()) == {1}, "some todo was requeued twice or never"
    assert Todo.objects.filter(id__in=below, state=TodoState.PENDING).count() == 4000
    assert Todo.objects.dead_lettered().filter(id__in=at_cap).count() == 1000


def test_reap_once_by_two_reapers_with_due_retries_handles_each_once():
    seed(
        "reap",
        1500,
        state_sql="state = 'claimed', owner = 'x', lease_id = 'ls_x', attempt = 1,"
        " lease_expires_at = now() - interval '1s'",
    )
    seed("reap", 1500, state_sql="state = 'failed', attempt = 1, next_retry_at = now() - interval '1s'")
    results = run_together([lambda: queue.reap_once(batch=50), lambda: queue.reap_once(batch=50)])
    # A reaper stops at its first short batch, which the other reaper's locks can cause: sweep again.
    rest = queue.reap_once(batch=50)
    assert sum(r.requeued for r in results) + rest.requeued == 1500
    assert sum(r.retries_promoted for r in results) + rest.retries_promoted == 1500
    assert Todo.objects.filter(state=TodoState.PENDING).count() == 3000


def test_claim_next_skips_a_row_locked_by_an_open_claim(make_agent, make_todo):
    alice, bob = make_agent("alice"), make_agent("bob")
    oldest = make_todo("q", created_at=Now() - timedelta(minutes=2))
    second = make_todo("q", created_at=Now() - timedelta(minutes=1))
    with transaction.atomic():
        [held] = queue.claim_next(agent=alice)
        assert held.id == oldest.id
        # Another connection, while alice's claim is uncommitted: SKIP LOCKED passes over her row at
        # once (a plain FOR UPDATE would wait here until the join timed out).
        [bobs] = run_together([lambda: queue.claim_next(agent=bob)])
        assert [t.id for t in bobs] == [second.id]
        [nothing] = run_together([lambda: queue.claim_next(agent=bob)])
        assert nothing == []
    oldest.refresh_from_db()
    second.refresh_from_db()
    assert (oldest.state, oldest.owner) == (TodoState.CLAIMED, "alice")
    assert (second.state, second.owner) == (TodoState.CLAIMED, "bob")


def test_claim_next_takes_a_row_again_once_the_lock_is_rolled_back(make_agent, make_todo):
    bob = make_agent("bob")
    oldest = make_todo("q", created_at=Now() - timedelta(minutes=1))
    with transaction.atomic():
        Todo.objects.select_for_update().get(pk=oldest.pk)
        [during] = run_together([lambda: queue.claim_next(agent=bob)])
        assert during == []
    [after] = run_together([lambda: queue.claim_next(agent=bob)])
    assert [t.id for t in after] == [oldest.id]


def test_claim_one_of_a_row_being_claimed_waits_then_is_conflict(make_agent, make_todo):
    alice, bob = make_agent("alice"), make_agent("bob")
    target = make_todo("q")
    started = threading.Event()
    outcome: list[Any] = []

    def bob_claims() -> None:
        started.set()
        try:
            outcome.append(queue.claim(target.id, agent=bob))
        except TodoConflict as exc:
            outcome.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        queue.claim(target.id, agent=alice)
        thread = threading.Thread(target=bob_claims)
        thread.start()
        started.wait(5)
        thread.join(0.5)
        assert thread.is_alive(), "a claim of one locked row waits for the lock holder, it does not skip"
    thread.join(10)
    [result] = outcome
    assert isinstance(result, TodoConflict) and result.state == "claimed"
    target.refresh_from_db()
    assert target.owner == "alice" and target.attempt == 1


@pytest.mark.parametrize("at_cap", [False, True], ids=["below-cap", "at-cap"])
def test_complete_reaper_and_reclaim_racing_on_a_lapsed_todo_have_at_most_one_winner(make_agent, make_todo, at_cap):
    slow, fast = make_agent("slow"), make_agent("fast")
    rounds = 25
    for _ in range(rounds):
        todo = make_todo("race", max_attempts=1 if at_cap else 5)
        [mine] = queue.claim_next(agent=slow, queues=["race"])
        Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now() - timedelta(seconds=1))

        def complete(receipt: str = mine.lease_id, todo_id: str = todo.id) -> str:
            try:
                queue.complete(todo_id, agent=slow, lease_id=receipt, result="slow")
                return "won"
            except TodoConflict:
                return "lost"

        def reclaim(todo_id: str = todo.id) -> str:
            try:
                queue.claim(todo_id, agent=fast)
                return "won"
            except TodoConflict:
                return "lost"

        def reap() -> str:
            result = queue.requeue_lapsed(batch=10)
            return "swept" if result.requeued + result.dead_lettered else "nothing"

        completed, reclaimed, reaped = run_together([complete, reclaim, reap])
        todo.refresh_from_db()
        lapses = sum(1 for e in todo.errors if e["error"] == "lease expired")
        # The receipt holder and the re-claimer compete; the reaper only records the lapse.
        assert [completed, reclaimed].count("won") == 1
        if completed == "won":
            assert (todo.state, todo.result, todo.attempt) == (TodoState.DONE, "slow", 1)
            assert lapses == (1 if reaped == "swept" else 0)
        else:
            assert not at_cap, "a lapsed lease at its cap was handed out again"
            assert (todo.state, todo.owner, todo.attempt) == (TodoState.CLAIMED, "fast", 2)
            assert todo.lease_id != mine.lease_id
            assert lapses == 1


def test_around_a_due_time_two_reapers_and_eight_claimers_claim_each_scheduled_todo_once(make_agent):
    """300 todos fall due together a second from now. Claimers take due ones through the claim scan while
    two reapers promote the same rows to pending: whichever gets a row, it is claimed exactly once."""
    alice = make_agent("alice")
    created = seed("due", 300, state_sql="state = 'scheduled', run_at = now() + interval '1 second'")
    deadline = time.monotonic() + 20
    claimed = Counter[str]()
    lock = threading.Lock()

    def running() -> bool:
        with lock:
            return time.monotonic() < deadline and claimed.total() < len(created)

    def claimer() -> list[str]:
        got: list[str] = []
        while running():
            todos = queue.claim_next(agent=alice, limit=5)
            got.extend(t.id for t in todos)
            with lock:
                claimed.update(t.id for t in todos)
            if not todos:
                time.sleep(0.01)
        return got

    def reaper() -> list[str]:
        while running():
            queue.reap_once(batch=20)
            time.sleep(0.005)
        return []

    per_thread = run_together([claimer] * 8 + [reaper] * 2)
    assert_claimed_exactly_once(created, per_thread)


def test_concurrent_batches_naming_the_same_keys_in_opposite_orders_make_each_todo_once():
    # Each INSERT waits on a key the other holds uncommitted; inserting in opposite orders, two batches
    # would each wait for the other (a deadlock, one of them answered 503) unless keys go in one order.
    keys = [f"k{n:03}" for n in range(300)]
    for round_ in range(3):
        forward = [{"queue": f"race.{round_}", "idempotency_key": k} for k in keys]
        outcomes = run_together([lambda items=items: queue.create_many(items) for items in (forward, forward[::-1])])
        first = {ref.idempotency_key: (ref.id, made) for ref, made in outcomes[0]}
        second = {ref.idempotency_key: (ref.id, made) for ref, made in outcomes[1]}
        assert {k: i for k, (i, _) in first.items()} == {k: i for k, (i, _) in second.items()}
        assert all(first[k][1] != second[k][1] for k in keys), "each key created by exactly one batch"
        assert Todo.objects.filter(queue=f"race.{round_}").count() == 300
