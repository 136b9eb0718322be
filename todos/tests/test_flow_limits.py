"""Named limits (issue 31): shared by every queue and todo naming them, decided in the claim statement
(todos/sql/flow.py) under concurrent claimers on their own connections; a todo naming none pays nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from todos import controls, flow, queue, sql
from todos.errors import TodoConflict
from todos.models import Agent, Todo, TodoState
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def seed_limited(queue_name: str, n: int, limits: list[str] | None, fair_key: str = "") -> list[str]:
    items = [{"queue": queue_name, "title": f"t{i}", "limits": limits, "fair_key": fair_key} for i in range(n)]
    return [ref.id for ref, _ in queue.create_many(items)]


def _live(sql_where: str, params: list[object]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM todos_todo WHERE state = 'claimed' AND lease_expires_at >= now() AND {sql_where}",
            params,
        )
        return int(cursor.fetchone()[0])


def _hammer(agent: Agent, queues: list[str], claimers: int, *, limit: int = 2, hold: float = 0.01) -> list[str]:
    """Claimers that claim, hold a moment, complete, until the queues are empty; every id they took."""

    def claimer() -> list[str]:
        got: list[str] = []
        idle = 0
        while idle < 15:
            todos = queue.claim_next(agent=agent, queues=queues, limit=limit)
            if not todos:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            time.sleep(hold)
            queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
            got += [t.id for t in todos]
        return got

    return [i for ids in run_together([claimer] * claimers) for i in ids]


def test_a_limit_shared_by_two_queues_holds_its_max_claimed_under_twelve_claimers(agent: Agent) -> None:
    flow.put("openai", max_claimed=3)
    created = seed_limited("reviews", 30, ["openai"]) + seed_limited("summaries", 30, ["openai"])
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _live("limits @> ARRAY['openai']", []))
        connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        claimed = _hammer(agent, ["reviews", "summaries"], 12)
    finally:
        stop.set()
        watcher.join()
    assert sorted(claimed) == sorted(created), "every todo claimed exactly once"
    assert 1 <= peak[0] <= 3, peak


def test_a_queue_naming_a_limit_holds_all_its_todos(agent: Agent) -> None:
    flow.put("github", max_claimed=1)
    seed_limited("prs", 4, None)
    controls.set_limits("prs", limits=["github"])
    first = queue.claim_next(agent=agent, queues=["prs"], limit=4)
    assert len(first) == 1
    assert queue.claim_next(agent=agent, queues=["prs"], limit=4) == []
    queue.complete(first[0].id, agent=agent, lease_id=first[0].lease_id)
    assert len(queue.claim_next(agent=agent, queues=["prs"], limit=4)) == 1


def test_a_limits_rate_lets_through_its_burst_then_its_rate(agent: Agent) -> None:
    flow.put("slow", rate_per_second=0.001, rate_burst=5)
    seed_limited("rated", 20, ["slow"])
    got = _hammer(agent, ["rated"], 8, hold=0)
    assert len(got) == 5, "the burst, and (at one token in 1,000 s) nothing more"


def test_per_key_caps_each_fair_key_times_its_weight(agent: Agent) -> None:
    flow.put("tenant-cap", per_key=1)
    seed_limited("tenants", 6, ["tenant-cap"], fair_key="big")
    seed_limited("tenants", 6, ["tenant-cap"], fair_key="small")
    controls.set_limits("tenants", fair_weights={"big": 2})
    todos = queue.claim_next(agent=agent, queues=["tenants"], limit=10)
    assert Counter(t.fair_key for t in todos) == {"big": 2, "small": 1}


def test_limits_and_plain_todos_share_a_queue_and_the_plain_ones_flow(agent: Agent) -> None:
    flow.put("tight", max_claimed=1)
    seed_limited("mixed", 3, ["tight"])
    plain = seed_limited("mixed", 3, None)
    todos = queue.claim_next(agent=agent, queues=["mixed"], limit=6)
    assert len(todos) == 4, "one limited, and the three plain ones"
    assert set(plain) <= {t.id for t in todos}


def test_a_name_no_put_defined_limits_nothing_and_claim_by_id_obeys_a_limit(agent: Agent) -> None:
    seed_limited("free", 3, ["undefined"])
    assert len(queue.claim_next(agent=agent, queues=["free"], limit=3)) == 3
    flow.put("one", max_claimed=1)
    a, b = seed_limited("byid", 2, ["one"])
    assert queue.claim(a, agent=agent).state == TodoState.CLAIMED
    with pytest.raises(TodoConflict):
        queue.claim(b, agent=agent)
    assert Todo.objects.get(pk=b).state == TodoState.PENDING


def _limit_row_reads() -> int:
    """Scans of todos_limit so far, as the statistics system has them (a backend flushes its counts when it
    exits: the claims run on a thread's own connection, closed at its end)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE relname = 'todos_limit'"
        )
        return int(cursor.fetchone()[0])


def _reads_after(claims: object) -> int:
    before = _limit_row_reads()
    run_together([claims])  # type: ignore[list-item]
    for _ in range(50):  # the exiting backend's flush lands within moments
        if (after := _limit_row_reads()) != before:
            return after - before
        time.sleep(0.05)
    return 0


def test_a_plain_claim_never_reads_a_limit_row(agent: Agent) -> None:
    """A plain queue's claim is one statement, CLAIM_NEXT, which names no limit table (its only new work is
    testing the limits column of the rows it chose: NULL); a todo naming a limit hands over to CLAIM_NEXT_FAIR,
    which reads the limit's row. Counted by PostgreSQL's own table statistics."""
    assert "todos_limit" not in sql.CLAIM_NEXT
    _reads_after(lambda: (flow.put("unused", max_claimed=1), seed_limited("plainq", 5, None)))  # flushed at exit
    assert _reads_after(lambda: [queue.claim_next(agent=agent, queues=["plainq"]) for _ in range(5)]) == 0
    seed_limited("plainq", 1, ["unused"])
    assert _reads_after(lambda: queue.claim_next(agent=agent, queues=["plainq"])) > 0, "the measure sees a read"


def test_rate_per_key_on_a_fair_queue_gives_each_key_its_weighted_burst_under_eight_claimers(agent: Agent) -> None:
    """rate_per_key 2 (burst: one second's worth): a key of weight 2 gets 4, the others 2, and (the bucket
    refilling at 2 and 4 a second) no more within the test's short window."""
    controls_queue = "per-key"
    seed_limited(controls_queue, 30, None, fair_key="big")
    seed_limited(controls_queue, 30, None, fair_key="small")
    controls.set_limits(controls_queue, fair=True, fair_weights={"big": 2}, rate_per_key=0.01)
    taken = Counter(t.fair_key for t in (queue.claim_next(agent=agent, queues=[controls_queue], limit=10)))
    assert taken == {"big": 1, "small": 1}, "burst: one second's worth, at least 1"
    controls.set_limits(controls_queue, rate_per_key=2)
    with connection.cursor() as cursor:  # start the buckets full again
        cursor.execute("UPDATE todos_fairkey SET tokens = NULL WHERE queue = %s", [controls_queue])
    got: Counter[str] = Counter()
    lock = threading.Lock()

    def claimer() -> None:
        for _ in range(5):
            todos = queue.claim_next(agent=agent, queues=[controls_queue], limit=3)
            with lock:
                got.update(t.fair_key for t in todos)

    started = time.monotonic()
    run_together([claimer] * 8)
    elapsed = time.monotonic() - started
    # bursts 4 and 2, then refills at 4/s and 2/s for the elapsed time
    assert 4 <= got["big"] <= 4 + int(4 * elapsed) + 1, (got, elapsed)
    assert 2 <= got["small"] <= 2 + int(2 * elapsed) + 1, (got, elapsed)
