"""Attacks on fair reservations (issue 31), each agent token assumed compromised: the fast claim
(CLAIM_FAIR_READY) takes reserved todos without the queue's lock, so it must carry the caller's claim scopes, the
wanted filter and the pause as every claim does: another tenant's reserved todos are never handed out."""

from __future__ import annotations

from typing import Any

import pytest

from todos import controls, queue, sql
from todos.models import Agent, FairReady
from todos.rows import fetch_todos
from todos.tests.test_fair_reserve import contended_claim, weighted

pytestmark = pytest.mark.django_db(transaction=True)


def _reserved(owner: Agent, name: str, settings: Any) -> list[str]:
    settings.FAIR_RESERVE = 7
    weighted(name, 20)
    contended_claim(owner, name)
    ids = list(FairReady.objects.filter(queue=name).values_list("id", flat=True))
    assert len(ids) == 7
    return ids


def test_another_tenants_reserved_todos_are_never_claimed_through_the_fast_claim(
    make_agent: Any, api_for: Any, settings: Any
) -> None:
    owner = make_agent("owner", claim=["secret.*"])
    attacker = make_agent("mallory", claim=["public.*"])
    secret = _reserved(owner, "secret.q", settings)
    weighted("public.q", 5)
    api = api_for(attacker)
    # Over REST: naming the queue is refused; a glob wider than its scopes, or no filter, takes its own queues only.
    assert api.post("/todos/claim/", {"queues": ["secret.q"]}).status_code == 403
    taken: list[str] = []
    for body in ({"queues": ["*"], "limit": 3}, {"limit": 100}, {"queues": ["*"], "limit": 100}):
        while todos := api.post("/todos/claim/", body).json()["todos"]:
            taken += [t["id"] for t in todos]
    assert len(taken) == 10 and not set(taken) & set(secret)
    # The statement itself, with every pattern the attacker could pass as its wanted filter: its scopes still bind.
    params = {
        "scopes": attacker.claim_like_patterns(),
        "wanted": ["%", "secret.q", "secret%"],
        "agent": attacker.name,
        "owner": attacker.name,
        "limit": 100,
        "lease_seconds": 60.0,
    }
    assert [t for t in fetch_todos(sql.CLAIM_FAIR_READY, params) if t.id] == []
    assert sorted(FairReady.objects.filter(queue="secret.q").values_list("id", flat=True)) == sorted(secret)


def test_a_paused_queues_reserved_todos_are_not_handed_out(make_agent: Any, settings: Any) -> None:
    owner = make_agent("owner", claim=["held.*"])
    reserved = _reserved(owner, "held.q", settings)
    controls.pause("held.q")
    assert queue.claim_next(agent=owner, queues=["held.*"], limit=100) == []
    assert sorted(FairReady.objects.filter(queue="held.q").values_list("id", flat=True)) == sorted(reserved)
    controls.resume("held.q")
    claimed = [t.id for t in queue.claim_next(agent=owner, queues=["held.*"], limit=100)]
    assert len(claimed) == len(set(claimed)) == 39 and set(reserved) <= set(claimed)
