"""Fair share (issue 22): weighted round robin over the todos' fair_keys and per-key caps, decided by the
claim statement (todos/sql/claim.py, CLAIM_NEXT_FAIR), against real PostgreSQL with concurrent claimers."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from todos import controls, queue
from todos.models import Agent, FairKey, Queue, Todo, TodoState
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def seed_keyed(queue_name: str, key: str, n: int, *, first: int = 0, priority: int = 0) -> list[str]:
    """n pending todos of one key in one INSERT (the registering trigger runs for each row, as for creates),
    in run_at order after ``first`` milliseconds."""
    Queue.objects.get_or_create(name=queue_name)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors,
                                    created_at, updated_at, run_at, priority, fair_key)
            SELECT 'td_' || replace(gen_random_uuid()::text, '-', ''), %s, '', 'k', 'seeded', '{}'::jsonb,
                   'pending', 0, 5, '[]'::jsonb, now(), now(),
                   now() - interval '1 hour' + (%s + i) * interval '1 millisecond', %s, %s
            FROM generate_series(1, %s) AS i
            RETURNING id
            """,
            [queue_name, first, priority, key, n],
        )
        return [row[0] for row in cursor.fetchall()]


def _claim_all(agent: Agent, queue_name: str, n: int, *, limit: int = 1) -> list[Todo]:
    """n claims (each completed at once), in the order they were handed out."""
    taken: list[Todo] = []
    while len(taken) < n:
        todos = queue.claim_next(agent=agent, queues=[queue_name], limit=limit)
        assert todos, "the queue still has work"
        for todo in todos:
            queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
        taken += todos
    return taken


def test_a_flooding_key_does_not_hold_back_twenty_small_keys_past_the_first_42_claims(agent):
    Queue.objects.create(name="tenants", fair=True)
    seed_keyed("tenants", "big", 10_000)
    small = [f"small-{i:02}" for i in range(20)]
    for i, key in enumerate(small):
        seed_keyed("tenants", key, 5, first=20_000 + i)  # all behind the flood in run_at
    order: list[tuple[float, str]] = []
    lock = threading.Lock()

    def claimer() -> None:
        for _ in range(6):
            for todo in queue.claim_next(agent=agent, queues=["tenants"]):
                with lock:
                    order.append((time.monotonic(), todo.fair_key))
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)

    run_together([claimer] * 16)
    first_42 = [key for _, key in sorted(order)[:42]]
    assert set(small) <= set(first_42), f"small keys missing: {sorted(set(small) - set(first_42))}"


def test_weights_three_to_one_share_4000_claims_three_to_one_within_ten_percent(agent):
    Queue.objects.create(name="weighted")
    controls.set_limits("weighted", fair=True, fair_weights={"heavy": 3})
    seed_keyed("weighted", "heavy", 4000)
    seed_keyed("weighted", "light", 4000)

    counted: Counter[str] = Counter()
    lock = threading.Lock()

    def claimer() -> None:
        while True:
            todos = queue.claim_next(agent=agent, queues=["weighted"], limit=10)
            queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
            with lock:
                counted.update(t.fair_key for t in todos)
                if sum(counted.values()) >= 4000:
                    return

    run_together([claimer] * 4)
    total = counted
    assert sum(total.values()) >= 4000
    assert 2.7 <= total["heavy"] / total["light"] <= 3.3, total


def test_a_batch_spreads_across_keys_by_weight(agent):
    Queue.objects.create(name="batch", fair=True, fair_weights={"a": 2})
    for key in ("a", "b", "c"):
        seed_keyed("batch", key, 10)
    todos = queue.claim_next(agent=agent, queues=["batch"], limit=8)
    # the 8 lowest tags: a 0, 1/2, 1, 3/2; b 0, 1; c 0, 1
    assert Counter(t.fair_key for t in todos) == {"a": 4, "b": 2, "c": 2}, "the lowest tags, as many per key"
    Queue.objects.create(name="wide", fair=True)
    for i in range(10):
        seed_keyed("wide", f"k{i}", 3)
    todos = queue.claim_next(agent=agent, queues=["wide"], limit=8)
    assert len({t.fair_key for t in todos}) == 8, "eight keys, one todo each"


def test_batches_fill_three_keys_limit_nine_three_each_one_key_limit_thirty_thirty(agent):
    Queue.objects.create(name="three", fair=True)
    for key in ("a", "b", "c"):
        seed_keyed("three", key, 30)
    todos = queue.claim_next(agent=agent, queues=["three"], limit=9)
    assert Counter(t.fair_key for t in todos) == {"a": 3, "b": 3, "c": 3}
    Queue.objects.create(name="one", fair=True)
    seed_keyed("one", "only", 40)
    assert len(queue.claim_next(agent=agent, queues=["one"], limit=30)) == 30


def test_a_batch_of_lapsed_and_due_todos_of_one_key_fills(agent):
    Queue.objects.create(name="lapsing", fair=True)
    ids = seed_keyed("lapsing", "k", 12)
    with connection.cursor() as cursor:  # 12 leases that lapsed a minute ago (below their attempt cap)
        cursor.execute(
            "UPDATE todos_todo SET state = 'claimed', attempt = 1, owner = 'gone', lease_id = 'ls_' || id, "
            "lease_expires_at = now() - interval '1 minute', claimed_at = now() - interval '2 minutes' "
            "WHERE id = ANY(%s)",
            [ids],
        )
    assert len(queue.claim_next(agent=agent, queues=["lapsing"], limit=10)) == 10


def test_priority_stays_global_on_a_fair_queue(agent):
    Queue.objects.create(name="urgent", fair=True)
    seed_keyed("urgent", "a", 5)
    seed_keyed("urgent", "b", 5)
    _claim_all(agent, "urgent", 4)  # a and b have had two turns each
    [hot] = seed_keyed("urgent", "a", 1, first=50, priority=-10)
    [todo] = queue.claim_next(agent=agent, queues=["urgent"])
    assert todo.id == hot


@pytest.mark.parametrize("cap", [1, 2])
def test_max_claimed_per_key_holds_under_sixteen_concurrent_claimers(agent, cap):
    name = f"serial{cap}"
    Queue.objects.create(name=name)
    controls.set_limits(name, fair=True, max_claimed_per_key=cap)
    keys = ["pr-1", "pr-2", "pr-3"]
    created = [i for key in keys for i in seed_keyed(name, key, 24)]
    history: list[tuple[float, str, int]] = []  # (monotonic time, key, +1 claimed / -1 about to complete)
    seen_in_rows: list[int] = []
    lock = threading.Lock()

    def live_per_key() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM todos_todo WHERE queue = %s "
                "AND state = 'claimed' AND lease_expires_at >= now() GROUP BY fair_key) k",
                [name],
            )
            return int(cursor.fetchone()[0])

    def claimer() -> list[str]:
        got: list[str] = []
        idle = 0
        while idle < 20:
            todos = queue.claim_next(agent=agent, queues=[name], limit=2)
            if not todos:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            # Recorded after the claim committed and before the complete starts: each recorded interval lies
            # inside the lease's real one, so an overlap above the cap here is one in the database.
            with lock:
                history.extend((time.monotonic(), t.fair_key, +1) for t in todos)
            seen = live_per_key()
            with lock:
                seen_in_rows.append(seen)
            time.sleep(0.01)
            for todo in todos:
                with lock:
                    history.append((time.monotonic(), todo.fair_key, -1))
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id)
                got.append(todo.id)
        return got

    claimed = [i for ids in run_together([claimer] * 16) for i in ids]
    assert sorted(claimed) == sorted(created), "every todo claimed exactly once"
    assert seen_in_rows and max(seen_in_rows) <= cap
    held: Counter[str] = Counter()
    peak = 0
    for _, key, delta in sorted(history):
        held[key] += delta
        peak = max(peak, held[key])
    assert peak == cap, "never above the cap, and the claimers did fill it (else an overshoot would go unseen)"


def test_a_key_that_returns_after_idling_takes_no_more_than_its_share(agent):
    Queue.objects.create(name="returning", fair=True)
    seed_keyed("returning", "a", 200)
    seed_keyed("returning", "b", 200)
    _claim_all(agent, "returning", 120)  # the round moves on while c has nothing
    seed_keyed("returning", "c", 50, first=1000)
    got = Counter(t.fair_key for t in _claim_all(agent, "returning", 30))
    assert got["c"] <= 11, got  # its share of 30 among three keys, and one round of slack
    assert got["c"] >= 9, got


def test_a_plain_queue_takes_no_key_and_writes_no_key_state(agent):
    seed_keyed("plain", "a", 3)
    seed_keyed("plain", "b", 3)
    todos = _claim_all(agent, "plain", 6)
    assert [t.fair_key for t in todos] == ["a", "a", "a", "b", "b", "b"], "claim order (run_at), keys ignored"
    assert not FairKey.objects.filter(queue="plain").exists()


def test_idle_keys_are_forgotten_and_come_back_at_the_round(agent):
    Queue.objects.create(name="forget", fair=True)
    seed_keyed("forget", "gone", 1)
    seed_keyed("forget", "busy", 100)
    _claim_all(agent, "forget", 40)
    assert not FairKey.objects.filter(queue="forget", key="gone").exists()
    seed_keyed("forget", "gone", 3, first=500)
    assert FairKey.objects.filter(queue="forget", key="gone").exists(), "registered by the create"
    assert Todo.objects.filter(queue="forget", fair_key="gone", state=TodoState.PENDING).count() == 3


def test_a_batch_create_registers_each_key_of_its_pending_todos_once(agent):
    Queue.objects.create(name="tenants.batch", fair=True)
    items = [{"queue": "tenants.batch", "fair_key": key} for key in ["a", "b", "a", "c", "b"]]
    items.append({"queue": "tenants.batch", "fair_key": "later", "delay_seconds": 600})  # scheduled: no key yet
    queue.create_many(items)
    assert sorted(FairKey.objects.filter(queue="tenants.batch").values_list("key", flat=True)) == ["a", "b", "c"]
    assert Counter(t.fair_key for t in _claim_all(agent, "tenants.batch", 5)) == {"a": 2, "b": 2, "c": 1}


def test_a_fair_claim_commits_without_waiting_for_its_flush_but_never_a_callers_transaction(agent):
    """The queue's row is held until commit, so a synchronous flush was inside every fair claimer's turn
    (issue 31's cost bar): CLAIM_NEXT_FAIR turns synchronous_commit off for its own transaction. A plain claim
    keeps the server's setting, and so does a fair claim made inside a caller's transaction (queue.claim_next
    sets it back at once: it would cover the caller's other writes), and the session after either."""
    from django.db import transaction

    from todos import sql
    from todos.rows import fetch_todos

    Queue.objects.create(name="plainq")
    Queue.objects.create(name="fairq", fair=True)
    seed_keyed("plainq", "a", 1)
    seed_keyed("fairq", "a", 2)

    def setting() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return str(cursor.fetchone()[0])

    with transaction.atomic():
        assert queue.claim_next(agent=agent, queues=["plainq"])
        assert setting() == "on"
    with transaction.atomic():  # the statement alone, as a claim in autocommit runs it
        params = {
            "scopes": agent.claim_like_patterns(),
            "wanted": ["fairq"],
            "agent": agent.name,
            "owner": agent.name,
            "limit": 1,
            "lease_seconds": 300.0,
            "reserve": 0,  # FAIR_RESERVE (issue 31): tags a contended turn reserves
        }
        assert fetch_todos(sql.CLAIM_NEXT_FAIR, params)
        assert setting() == "off"
    assert setting() == "on"
    with transaction.atomic():
        assert queue.claim_next(agent=agent, queues=["fairq"])
        assert setting() == "on"
    assert setting() == "on"
