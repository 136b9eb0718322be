"""Fair reservations (issue 31): a fair claimer that had to wait for its queue's row charges the next FAIR_RESERVE
tags to their keys, claims its own and leaves the rest in todos_fairready; later claims take them without the
queue's lock (CLAIM_FAIR_READY), in (priority, tag) order. Real PostgreSQL; the contention is made
deterministic by a second connection holding the queue's row while the claim waits for it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from todos import controls, queue
from todos.explain import explain_todo
from todos.limits import fair_reserve
from todos.models import Agent, FairReady, Queue, Todo
from todos.queue.claim import forget_keyed_scopes
from todos.tests.test_api_longpoll import Http
from todos.tests.test_concurrency import run_together
from todos.tests.test_queue_fair import seed_keyed

pytestmark = pytest.mark.django_db(transaction=True)


def ready_claims() -> float:
    """Todos claimed from reservations in this process so far (todos.metrics.FAIR_READY_CLAIMS)."""
    return REGISTRY.get_sample_value("switchboard_fair_ready_claims_total") or 0.0


def weighted(name: str, per_key: int, *, priority: int = 0) -> None:
    Queue.objects.create(name=name)
    controls.set_limits(name, fair=True, fair_weights={"heavy": 3})
    seed_keyed(name, "heavy", per_key, priority=priority)
    seed_keyed(name, "light", per_key, priority=priority)


def with_queue_row_held(name: str, *tasks: Callable[[], Any]) -> list[Any]:
    """Run ``tasks`` together while another connection holds the queue's row FOR NO KEY UPDATE; it lets go once
    as many statements as tasks wait for a lock (or after 30 s). Answers the tasks' results, in order."""
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM todos_queue WHERE name = %s FOR NO KEY UPDATE", [name])
            locked.set()
            assert release.wait(30)

    def after_lock(task: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            assert locked.wait(30)
            return task()

        return run

    def releaser() -> None:
        assert locked.wait(30)
        deadline = time.monotonic() + 30
        try:
            while _waiting_for_locks() < len(tasks) and time.monotonic() < deadline:
                time.sleep(0.005)
        finally:
            release.set()

    return run_together([holder, *map(after_lock, tasks), releaser])[1:-1]


def contended_claim(agent: Agent, name: str, *, limit: int = 1) -> list[Todo]:
    """A claim_next that has to wait for the queue's row: another connection holds it until the claim waits."""
    [todos] = with_queue_row_held(name, lambda: queue.claim_next(agent=agent, queues=[name], limit=limit))
    return list(todos)


def ready_rows(name: str) -> list[FairReady]:
    return list(FairReady.objects.filter(queue=name).order_by("priority", "tag"))


def _waiting_for_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def test_one_uncontended_claimer_reserves_nothing(agent: Agent) -> None:
    weighted("solo", 40)
    before = ready_claims()
    keys = []
    for _ in range(30):
        [todo] = queue.claim_next(agent=agent, queues=["solo"])
        keys.append(todo.fair_key)
        assert not FairReady.objects.exists()
    assert ready_claims() == before
    assert Counter(keys[:8]) == {"heavy": 6, "light": 2}  # tags 0,0,1/3,2/3,1,1,4/3,5/3


def test_a_contended_turn_charges_the_next_tags_and_later_claims_take_them_in_tag_order(agent: Agent, settings) -> None:
    settings.FAIR_RESERVE = 7
    weighted("busy", 40)
    before = ready_claims()
    [first] = contended_claim(agent, "busy")
    rows = ready_rows("busy")
    assert len(rows) == 7
    # The 8 lowest tags, as one claimer's 8 claims: heavy 0, 1/3, 2/3, 1, 4/3, 5/3; light 0, 1.
    assert Counter([first.fair_key] + [r.fair_key for r in rows]) == {"heavy": 6, "light": 2}
    assert first.fair_key == "heavy"  # the tie at tag 0 goes by run_at: heavy's were seeded first
    assert [r.tag for r in rows if r.fair_key == "light"] == [0.0, 1.0]
    # Why isn't it running (issue 30): a reserved todo says its turn is given, not that it waits for one.
    notes = [n["reason"] for n in explain_todo(rows[0].id, agent=agent)["notes"]]
    assert notes == ["fair_share_reserved"]
    later = [queue.claim_next(agent=agent, queues=["busy"])[0] for _ in range(7)]
    assert [t.id for t in later] == [r.id for r in rows]  # in (priority, tag) order, without the turn
    assert ready_claims() - before == 7 and not ready_rows("busy")
    # The passes were charged with them: the next claims go on from tag 2 (both keys), as one claimer's would.
    after = [queue.claim_next(agent=agent, queues=["busy"])[0].fair_key for _ in range(4)]
    assert Counter(after) == {"heavy": 3, "light": 1}


def test_claimers_queued_behind_a_reserver_each_reserve_the_next_tags(agent: Agent, settings) -> None:
    """Two claimers wait for the queue's row: each turn waited, so each reserves 7 beyond its own claim, the second
    from where the first's tags ended (it reads the passes fresh): 16 tags, 12 heavy and 4 light, none twice.
    Outstanding reservations grow by FAIR_RESERVE per claimer that queued for a turn (docs/architecture.md)."""
    settings.FAIR_RESERVE = 7
    weighted("queued", 40)

    def claim() -> list[Todo]:
        return queue.claim_next(agent=agent, queues=["queued"])

    first, second = with_queue_row_held("queued", claim, claim)
    rows = ready_rows("queued")
    ids = [t.id for t in first + second] + [r.id for r in rows]
    assert len(first) == len(second) == 1 and len(rows) == 14 and len(set(ids)) == 16
    assert Counter(t.fair_key for t in first + second + rows) == {"heavy": 12, "light": 4}


def test_a_batch_on_a_contended_queue_fills(agent: Agent, settings) -> None:
    settings.FAIR_RESERVE = 7
    weighted("batch", 40)
    assert len(contended_claim(agent, "batch", limit=3)) == 3
    assert len(ready_rows("batch")) == 9  # FAIR_RESERVE rounded up to whole batches of 3
    todos = queue.claim_next(agent=agent, queues=["batch"], limit=10)
    assert len(todos) == 10 and len({t.id for t in todos}) == 10  # 9 reserved, 1 from the turn
    assert not ready_rows("batch")


def test_an_urgent_todo_created_while_reservations_exist_is_claimed_before_them(agent: Agent, settings) -> None:
    settings.FAIR_RESERVE = 7
    weighted("urgent", 40, priority=5)
    contended_claim(agent, "urgent")
    assert len(ready_rows("urgent")) == 7
    [urgent] = seed_keyed("urgent", "light", 1, priority=1)
    [todo] = queue.claim_next(agent=agent, queues=["urgent"])
    assert todo.id == urgent
    first_ready = ready_rows("urgent")[0].id
    assert len(ready_rows("urgent")) == 7
    [todo] = queue.claim_next(agent=agent, queues=["urgent"])
    assert todo.id == first_ready
    assert len(ready_rows("urgent")) == 6


def test_a_reserved_todo_cancelled_claimed_by_id_or_expired_is_never_handed_out(agent: Agent, settings) -> None:
    settings.FAIR_RESERVE = 7
    weighted("gone", 20)
    contended_claim(agent, "gone")
    rows = ready_rows("gone")
    cancelled, by_id, expired = rows[0].id, rows[1].id, rows[2].id
    queue.cancel(cancelled, operator="test")
    queue.claim(by_id, agent=agent)
    Todo.objects.filter(pk=expired).update(expires_at=timezone.now() - timedelta(seconds=1))
    handed: list[str] = []
    while todos := queue.claim_next(agent=agent, queues=["gone"], limit=5):
        handed += [t.id for t in todos]
    assert not {cancelled, by_id, expired} & set(handed)
    assert len(handed) == len(set(handed)) == 40 - 1 - 3  # everything else, once
    assert not ready_rows("gone")


def test_reserved_todos_are_claimed_by_a_process_that_never_reserved(agent: Agent, settings) -> None:
    settings.FAIR_RESERVE = 8
    Queue.objects.create(name="strand", fair=True)
    seed_keyed("strand", "only", 5)
    contended_claim(agent, "strand")
    assert len(ready_rows("strand")) == 4  # everything left is reserved
    forget_keyed_scopes()  # another process: it remembers no reservation
    todos = queue.claim_next(agent=agent, queues=["strand"], limit=10)
    assert len(todos) == 4 and not ready_rows("strand")


def test_a_queue_made_unreservable_forgets_its_reservations(agent: Agent, settings) -> None:
    settings.FAIR_RESERVE = 7
    weighted("capped", 20)
    contended_claim(agent, "capped")
    assert len(ready_rows("capped")) == 7
    controls.set_limits("capped", fair_weights={"heavy": 2})  # still reservable: kept
    assert len(ready_rows("capped")) == 7
    controls.set_limits("capped", max_claimed=100)
    assert not ready_rows("capped")
    handed: list[str] = []
    while todos := queue.claim_next(agent=agent, queues=["capped"], limit=7):
        handed += [t.id for t in todos]
    assert len(handed) == len(set(handed)) == 39


def test_a_cap_set_while_a_turn_reserves_forgets_what_that_turn_reserved(agent: Agent, settings) -> None:
    """The PATCH waits for the turn's row; what the turn reserved meanwhile is committed after the PATCH's
    statement took its snapshot, so it is forgotten by a statement of its own (FORGET_RESERVATIONS), or no claim
    would ever take those todos (the walk skips them, the fast claim skips the capped queue)."""
    settings.FAIR_RESERVE = 7
    weighted("race", 20)

    def capper() -> None:
        deadline = time.monotonic() + 30
        while _waiting_for_locks() < 1 and time.monotonic() < deadline:  # the claimer waits first
            time.sleep(0.005)
        controls.set_limits("race", max_claimed=100)

    claimed, _ = with_queue_row_held("race", lambda: queue.claim_next(agent=agent, queues=["race"]), capper)
    assert len(claimed) == 1
    assert not ready_rows("race")
    handed: list[str] = []
    while todos := queue.claim_next(agent=agent, queues=["race"], limit=7):
        handed += [t.id for t in todos]
    assert len(handed) == len(set(handed)) == 39


def test_a_claimer_with_several_keyed_queues_never_reserves(agent: Agent, settings) -> None:
    """With two serialized queues eligible the turn makes no SKIP LOCKED probe (it could deadlock): no reservation."""
    settings.FAIR_RESERVE = 7
    weighted("two.a", 10)
    weighted("two.b", 10)
    [claimed] = with_queue_row_held("two.a", lambda: queue.claim_next(agent=agent, queues=["two.*"]))
    assert len(claimed) == 1
    assert not FairReady.objects.exists()


def _claim_loop(claim: Any, counted: Counter[str], lock: threading.Lock, total: int) -> None:
    while True:
        with lock:
            if sum(counted.values()) >= total:
                return
        keys = claim()
        with lock:
            counted.update(keys)


@pytest.mark.parametrize("claimers", [4, 16])
def test_weights_hold_with_reservations_at_4_and_16_claimers(agent: Agent, claimers: int) -> None:
    name = f"reserved{claimers}"
    weighted(name, 1200)
    counted: Counter[str] = Counter()
    lock = threading.Lock()
    before = ready_claims()

    outstanding: list[int] = []

    def claim() -> list[str]:
        todos = queue.claim_next(agent=agent, queues=[name])
        queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
        outstanding.append(FairReady.objects.filter(queue=name).count())
        return [t.fair_key or "" for t in todos]

    run_together([lambda: _claim_loop(claim, counted, lock, 800)] * claimers)
    assert 2.7 <= counted["heavy"] / counted["light"] <= 3.3, counted
    assert ready_claims() > before, "no claim was served from a reservation"
    # At most FAIR_RESERVE per claimer queued for a turn: the bound a newcomer key waits (docs/architecture.md).
    assert max(outstanding) <= claimers * fair_reserve(), max(outstanding)


def test_weights_hold_with_reservations_over_real_http_at_16_claimers(live_server, agent: Agent) -> None:
    weighted("httpreserved", 800)
    counted: Counter[str] = Counter()
    lock = threading.Lock()
    before = ready_claims()

    def loop() -> None:
        client = Http(live_server.url, agent.token)  # type: ignore[attr-defined]

        def claim() -> list[str]:
            response = client.post("/todos/claim/", {"queues": ["httpreserved"]})
            assert response.status_code == 200, response.content
            todos = response.json()["todos"]
            if todos:
                items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in todos]
                assert client.post("/todos/complete/", {"items": items}).status_code == 200
            return [t["fair_key"] for t in todos]

        try:
            _claim_loop(claim, counted, lock, 400)
        finally:
            client.close()

    run_together([loop] * 16)
    assert 2.7 <= counted["heavy"] / counted["light"] <= 3.3, counted
    assert ready_claims() > before, "no claim was served from a reservation"
