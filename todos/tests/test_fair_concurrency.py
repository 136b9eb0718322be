"""Fair share under concurrent claimers (issue 31): the weights hold at 1, 4 and 16 claimers, in process and
over real HTTP, and batches fill while others claim. Fair claims take turns on the queue's row
(todos/sql/claim.py, _SERIALIZED), so each sees its predecessor's passes: the 3:1 share is exact by
construction, which lets these tests use hundreds of claims rather than the bench's 4,000."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from todos import controls, queue
from todos.models import Agent, Queue
from todos.tests.test_api_longpoll import Http
from todos.tests.test_concurrency import run_together
from todos.tests.test_queue_fair import seed_keyed

pytestmark = pytest.mark.django_db(transaction=True)


def _weighted(name: str, per_key: int) -> None:
    Queue.objects.create(name=name)
    controls.set_limits(name, fair=True, fair_weights={"heavy": 3})
    seed_keyed(name, "heavy", per_key)
    seed_keyed(name, "light", per_key)


def _ratio(counted: Counter[str]) -> float:
    return counted["heavy"] / counted["light"]


@pytest.mark.parametrize("claimers", [1, 4, 16])
def test_weights_three_to_one_hold_within_ten_percent_at_1_4_and_16_claimers(agent: Agent, claimers: int) -> None:
    name = f"weighted{claimers}"
    _weighted(name, 1000)  # both keys stay busy for all 800 claims
    counted: Counter[str] = Counter()
    lock = threading.Lock()

    def claimer() -> None:
        while True:
            with lock:
                if sum(counted.values()) >= 800:
                    return
            todos = queue.claim_next(agent=agent, queues=[name])
            queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
            with lock:
                counted.update(t.fair_key for t in todos)

    run_together([claimer] * claimers)
    assert 2.7 <= _ratio(counted) <= 3.3, counted


@pytest.mark.parametrize("claimers", [4, 16])
def test_weights_hold_over_real_http_at_4_and_16_claimers(live_server, agent: Agent, claimers: int) -> None:
    name = f"http{claimers}"
    _weighted(name, 600)
    counted: Counter[str] = Counter()
    lock = threading.Lock()

    def claimer() -> None:
        client = Http(live_server.url, agent.token)
        try:
            while True:
                with lock:
                    if sum(counted.values()) >= 400:
                        return
                response = client.post("/todos/claim/", {"queues": [name]})
                assert response.status_code == 200, response.content
                todos = response.json()["todos"]
                items = [{"id": t["id"], "lease_id": t["lease_id"]} for t in todos]
                if items:
                    assert client.post("/todos/complete/", {"items": items}).status_code == 200
                with lock:
                    counted.update(t["fair_key"] for t in todos)
        finally:
            client.close()

    run_together([claimer] * claimers)
    assert 2.7 <= _ratio(counted) <= 3.3, counted


def test_batches_fill_while_sixteen_claimers_take_batches_of_nine(agent: Agent) -> None:
    Queue.objects.create(name="batches", fair=True)
    for key in ("a", "b", "c"):
        seed_keyed("batches", key, 200)

    def claimer() -> list[Counter[str]]:
        batches = []
        for _ in range(3):
            todos = queue.claim_next(agent=agent, queues=["batches"], limit=9)
            queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
            batches.append(Counter(t.fair_key for t in todos))
        return batches

    batches = [b for per_thread in run_together([claimer] * 16) for b in per_thread]
    assert len(batches) == 48
    assert all(b == {"a": 3, "b": 3, "c": 3} for b in batches), [b for b in batches if b != {"a": 3, "b": 3, "c": 3}]


def test_one_busy_key_fills_batches_of_thirty_under_four_claimers(agent: Agent) -> None:
    Queue.objects.create(name="single", fair=True)
    seed_keyed("single", "only", 400)

    def claimer() -> list[int]:
        sizes = []
        for _ in range(3):
            todos = queue.claim_next(agent=agent, queues=["single"], limit=30)
            queue.complete_many([(t.id, t.lease_id, None) for t in todos], agent=agent)
            sizes.append(len(todos))
        return sizes

    assert [n for sizes in run_together([claimer] * 4) for n in sizes] == [30] * 12
