"""Parking on a quota wall (issue 31): a holder's fail or release with ``park`` gives the todo back (no attempt
spent) and parks the named limit until its reset: every todo it holds, in every queue, stays pending with
``blocked``, claimers take none of them, and they resume on their own at that time (a long-poll wakes for it);
an operator can lift the park."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from todos import flow, queue
from todos.models import Agent, Limit, Todo, TodoState
from todos.tests.test_api_longpoll import Http
from todos.tests.test_concurrency import run_together

pytestmark = pytest.mark.django_db(transaction=True)


def _iso(seconds: float) -> str:
    return (timezone.now() + timedelta(seconds=seconds)).isoformat()


def _claimed_one(api: Any, queue_name: str) -> dict[str, Any]:
    response = api.post("/todos/claim/", {"queues": [queue_name]})
    assert response.status_code == 200, response.content
    [todo] = response.json()["todos"]
    return todo  # type: ignore[no-any-return]


def test_a_fleet_parked_on_a_429_waits_blocked_and_resumes_at_the_reset(api: Any, agent: Agent) -> None:
    flow.put("openai", max_claimed=8)
    for q in ("reviews", "summaries"):
        for i in range(2):
            assert api.post("/todos/", {"queue": q, "title": f"{q}{i}", "limits": ["openai"]}).status_code == 201
    api.post("/todos/", {"queue": "summaries", "title": "plain"})
    held = _claimed_one(api, "reviews")
    until = _iso(1.5)
    response = api.post(
        f"/todos/{held['id']}/fail/",
        {"lease_id": held["lease_id"], "error": "429", "park": {"limit": "openai", "until": until, "reason": "429"}},
    )
    assert response.status_code == 200, response.content
    shown = response.json()
    assert (shown["state"], shown["attempt"], shown["lease_id"]) == ("pending", 0, None), "no attempt spent"
    assert shown["errors"][-1]["parked"]["limit"] == "openai"
    blocked = api.get(f"/todos/{held['id']}/").json()["blocked"]
    assert (blocked["limit"], blocked["reason"]) == ("openai", "429")
    listed = api.get("/todos/", queue="summaries").json()["results"]
    assert {t["title"]: t["blocked"] is not None for t in listed} == {
        "summaries0": True,
        "summaries1": True,
        "plain": False,
    }
    # every claimer, every queue: only the plain todo comes out while parked
    got = queue.claim_next(agent=agent, limit=10)
    assert [t.title for t in got] == ["plain"]
    assert queue.claim_next(agent=agent, limit=10) == []
    time.sleep(max(0.0, (timezone.datetime.fromisoformat(until) - timezone.now()).total_seconds()) + 0.05)
    assert sorted(t.title for t in queue.claim_next(agent=agent, limit=10)) == [
        "reviews0",
        "reviews1",
        "summaries0",
        "summaries1",
    ], "resumed on their own at the reset"
    assert Todo.objects.get(pk=held["id"]).attempt == 1, "the parked attempt was given back, this is its first"


def test_release_with_park_and_an_operator_lifting_it(api: Any, agent: Agent, make_agent: Any, api_for: Any) -> None:
    manager = api_for(make_agent("ops", can_manage_queues=True))
    api.post("/todos/", {"queue": "jobs", "limits": ["github"]})
    api.post("/todos/", {"queue": "jobs", "limits": ["github"]})
    held = _claimed_one(api, "jobs")
    response = api.post(
        f"/todos/{held['id']}/release/",
        {"lease_id": held["lease_id"], "park": {"limit": "github", "until": _iso(3600), "reason": "secondary rate"}},
    )
    assert response.status_code == 200, response.content
    assert Limit.objects.get(name="github").park_reason == "secondary rate", "a park defines the limit it names"
    assert api.get("/limits/github/").json()["parked"]["reason"] == "secondary rate"
    assert queue.claim_next(agent=agent, limit=5) == []
    assert api.client.delete("/api/v1/limits/github/park/").status_code == 403, "lifting is an operator's"
    lifted = manager.client.delete("/api/v1/limits/github/park/")
    assert lifted.status_code == 200 and lifted.json()["parked"] is None
    assert len(queue.claim_next(agent=agent, limit=5)) == 2


def test_a_park_keeps_the_later_reset_of_two_holders(api: Any) -> None:
    for _ in range(2):
        api.post("/todos/", {"queue": "jobs", "limits": ["openai"]})
    first, second = _claimed_one(api, "jobs"), _claimed_one(api, "jobs")
    later, sooner = _iso(600), _iso(60)
    for todo, until in ((first, later), (second, sooner)):
        body = {"lease_id": todo["lease_id"], "park": {"limit": "openai", "until": until}}
        assert api.post(f"/todos/{todo['id']}/release/", body).status_code == 200
    parked = Limit.objects.get(name="openai").parked_until
    assert parked is not None and abs((parked - timezone.datetime.fromisoformat(later)).total_seconds()) < 0.01


@pytest.mark.parametrize(
    "park",
    [
        {"limit": "openai", "until": "2000-01-01T00:00:00Z"},
        {"limit": "openai", "until": "in an hour"},
        {"limit": "openai"},
        {"limit": "bad name", "until": "2100-01-01T00:00:00Z"},
        {"limit": "openai", "until": "2100-01-01T00:00:00Z"},  # past the 7-day bound
        {"limit": "openai", "until": "2100-01-01T00:00:00Z", "surprise": 1},
    ],
)
def test_bad_parks_are_400_naming_park_and_change_nothing(api: Any, park: dict[str, Any]) -> None:
    api.post("/todos/", {"queue": "jobs", "limits": ["openai"]})
    held = _claimed_one(api, "jobs")
    response = api.post(f"/todos/{held['id']}/fail/", {"lease_id": held["lease_id"], "park": park})
    assert response.status_code == 400, response.content
    assert "park" in json.dumps(response.json()["error"]["fields"])
    assert Todo.objects.get(pk=held["id"]).state == TodoState.CLAIMED
    assert not Limit.objects.exists()


def test_sixteen_claimers_take_nothing_a_parked_limit_holds_until_its_reset(agent: Agent) -> None:
    ids = [queue.create(queue=f"q{i % 4}", limits=["wall"])[0].id for i in range(40)]
    plain = [queue.create(queue=f"q{i % 4}")[0].id for i in range(40)]
    [first] = queue.claim_next(agent=agent, queues=["q0"])
    reset = timezone.now() + timedelta(seconds=1.5)
    queue.park(first.id, agent=agent, lease_id=first.lease_id or "", limit="wall", until=reset, reason="429")
    taken: list[tuple[float, str]] = []

    def claimer() -> None:
        while timezone.now() < reset + timedelta(seconds=1):
            for todo in queue.claim_next(agent=agent, limit=3):
                taken.append((time.time(), todo.id))
                queue.complete(todo.id, agent=agent, lease_id=todo.lease_id or "")
            time.sleep(0.01)

    run_together([claimer] * 16)
    held = set(ids)
    early = [i for at, i in taken if i in held and at < reset.timestamp()]
    assert early == [], "a parked limit let a todo through before its reset"
    assert {i for _, i in taken} == held | set(plain), "after the reset every held todo was taken, each once"
    assert len(taken) == len(held | set(plain))


def test_a_long_poll_on_a_parked_queue_wakes_at_the_reset(live_server: Any, agent: Agent) -> None:
    todo, _ = queue.create(queue="walled", limits=["wall"])
    [held] = queue.claim_next(agent=agent, queues=["walled"])
    reset = timezone.now() + timedelta(seconds=1.5)
    queue.park(held.id, agent=agent, lease_id=held.lease_id or "", limit="wall", until=reset)
    client = Http(live_server.url, agent.token)  # type: ignore[attr-defined]
    try:
        started = time.monotonic()
        response = client.post("/todos/claim/", {"queues": ["walled"], "wait_seconds": 5})
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert response.status_code == 200
    assert [t["id"] for t in response.json()["todos"]] == [todo.id]
    assert 0.8 <= elapsed <= 3.5, elapsed


def test_on_a_fair_queue_a_key_parked_on_a_wall_does_not_starve_the_other_keys(agent: Agent) -> None:
    from todos import controls

    for i in range(3):
        queue.create(queue="tenants", fair_key="walled", limits=["wall"], title=f"w{i}")
    for i in range(3):
        queue.create(queue="tenants", fair_key="free", title=f"f{i}")
    controls.set_limits("tenants", fair=True)
    [held] = [t for t in queue.claim_next(agent=agent, queues=["tenants"], limit=2) if t.fair_key == "walled"]
    queue.park(
        held.id, agent=agent, lease_id=held.lease_id or "", limit="wall", until=timezone.now() + timedelta(hours=1)
    )
    got = [queue.claim_next(agent=agent, queues=["tenants"]) for _ in range(3)]
    assert [[t.fair_key for t in todos] for todos in got][:2] == [["free"], ["free"]], got
