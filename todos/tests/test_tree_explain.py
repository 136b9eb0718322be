"""Why isn't it running (issue 30, item 6): GET /todos/<id>/explain/ names each reason a claim would not take
the todo now, from the claim's own predicates; GET /agents/me/explain/ says why a claim got nothing; and an
agreement test: explain says claimable exactly when a claim of that todo takes it (hypothesis)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from todos import controls, queue, sql
from todos.errors import QueueError
from todos.explain import explain_todo
from todos.models import Agent, Queue, Todo, TodoState
from todos.sql import explain as explain_sql

pytestmark = pytest.mark.django_db


def _reasons(api: Any, todo_id: str) -> list[str]:
    response = api.get(f"/todos/{todo_id}/explain/")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["claimable"] is (not body["reasons"])
    return [r["reason"] for r in body["reasons"]]


def test_a_pending_todo_in_an_open_queue_is_claimable(api, make_todo):
    todo = make_todo("jobs")
    assert _reasons(api, todo.id) == []


def test_each_state_reason(api, agent, make_todo):
    first = make_todo("jobs")
    waiting, _ = queue.create(queue="jobs", depends_on=[first.id])
    scheduled = make_todo("jobs", delay_seconds=3600)
    retrying = make_todo("jobs", state=TodoState.FAILED, next_retry_at=Now() + timedelta(hours=1))
    done = make_todo("jobs", state=TodoState.DONE)
    dead = make_todo("jobs", state=TodoState.FAILED)
    held = queue.claim(make_todo("jobs").id, agent=agent)
    assert _reasons(api, waiting.id) == ["waiting"]
    assert _reasons(api, scheduled.id) == ["run_at"]
    assert _reasons(api, retrying.id) == ["retry_at"]
    assert _reasons(api, done.id) == ["state"]
    assert api.get(f"/todos/{dead.id}/explain/").json()["reasons"][0]["state"] == "dead-letter"
    assert _reasons(api, held.id) == ["state"]


def test_each_queue_reason_in_order(api, agent, make_agent, make_todo):
    todo = make_todo("jobs", assignee="bob")
    assert _reasons(api, todo.id) == ["assignee"]
    Todo.objects.filter(pk=todo.pk).update(assignee=None)
    Queue.objects.get_or_create(name="jobs")
    controls.pause("jobs")
    controls.set_limits("jobs", max_claimed=0, rate_per_second=1, rate_burst=1)
    Queue.objects.filter(name="jobs").update(tokens=0, refilled_at=Now())
    assert _reasons(api, todo.id) == ["queue_paused", "max_claimed", "rate_limited"]


def test_the_per_key_cap_and_the_fair_note(api, agent, make_todo):
    Queue.objects.get_or_create(name="jobs")
    controls.set_limits("jobs", fair=True, max_claimed_per_key=1)
    queue.claim(make_todo("jobs", fair_key="acme").id, agent=agent)
    waiting = make_todo("jobs", fair_key="acme")
    body = api.get(f"/todos/{waiting.id}/explain/").json()
    assert [r["reason"] for r in body["reasons"]] == ["per_key_cap"]
    assert [n["reason"] for n in body["notes"]] == ["fair_share"]


def test_a_spent_budget_is_a_reason(api, agent):
    root = queue.claim(queue.create(queue="jobs", budget={"cost_usd": 1})[0].id, agent=agent)
    child, _ = queue.create(queue="jobs", agent=agent, parent={"id": root.id, "lease_id": str(root.lease_id)})
    queue.heartbeat(root.id, agent=agent, lease_id=str(root.lease_id), usage={"cost_usd": 2})
    body = api.get(f"/todos/{child.id}/explain/").json()
    assert [r["reason"] for r in body["reasons"]] == ["budget"] and body["reasons"][0]["root_id"] == root.id


def test_no_agent_whose_scopes_cover_the_queue(make_agent, api_for):
    creator = make_agent("creator", claim=["other"], create=["lonely"])
    todo, _ = queue.create(queue="lonely", agent=creator)
    body = api_for(creator).get(f"/todos/{todo.id}/explain/").json()
    assert [r["reason"] for r in body["reasons"]] == ["no_agent"]
    assert body["reasons"][0]["last_claimed_at"] is None
    make_agent("claimer", claim=["lonely"])
    assert [r["reason"] for r in api_for(creator).get(f"/todos/{todo.id}/explain/").json()["reasons"]] == ["scopes"]


def test_explain_is_404_outside_the_callers_scopes(make_agent, api_for, make_todo):
    todo = make_todo("secret")
    outsider = make_agent("outsider", claim=["public"])
    assert api_for(outsider).get(f"/todos/{todo.id}/explain/").status_code == 404


def test_the_agents_explain_says_why_its_claim_got_nothing(api, agent, make_todo):
    make_todo("busy", assignee="bob")
    make_todo("later", delay_seconds=3600)
    make_todo("open")
    Queue.objects.get_or_create(name="stopped")
    controls.pause("stopped")
    body = api.get("/agents/me/explain/", queues="busy,later,open,stopped,nowhere").json()
    by_queue = {q["queue"]: [r["reason"] for r in q["reasons"]] for q in body["queues"]}
    assert by_queue == {
        "busy": ["assignee", "empty"],
        "later": ["run_at", "empty"],
        "open": [],
        "stopped": ["queue_paused", "empty"],
    }


def test_explains_fragments_are_the_claim_statements_own_text():
    for statement in (sql.CLAIM_NEXT, sql.CLAIM_NEXT_LIMITED, sql.CLAIM_NEXT_FAIR, sql.CLAIM_ONE):
        assert f"{explain_sql.ASSIGNEE} AND {sql.BUDGET_OPEN}" in statement
        assert explain_sql.PAUSED in statement
    # A limited queue's claims are CLAIM_NEXT_LIMITED's, CLAIM_NEXT_FAIR's and CLAIM_ONE's (issue 32): the plain
    # CLAIM_NEXT counts no lease and reads no bucket.
    for statement in (sql.CLAIM_NEXT_LIMITED, sql.CLAIM_NEXT_FAIR, sql.CLAIM_ONE):
        assert explain_sql.TOKENS in statement
        assert explain_sql.LIVE_LEASES in statement


_SHAPES = st.fixed_dictionaries(
    {
        "state": st.sampled_from(
            ["pending", "scheduled_ahead", "scheduled_due", "waiting", "done", "claimed", "lapsed"]
        ),
        "paused": st.booleans(),
        "max_claimed": st.sampled_from([None, 0, 5]),
        "tokens": st.sampled_from([None, 0.0, 3.0]),
        "assignee": st.sampled_from([None, "alice", "bob"]),
        "budget_spent": st.booleans(),
        "key_cap": st.sampled_from([None, 0]),
    }
)


def _shaped(agent: Agent, shape: dict[str, Any]) -> Todo:
    Queue.objects.filter(name="agree").delete()
    Todo.objects.all().delete()
    Queue.objects.create(name="agree", paused=shape["paused"], max_claimed=shape["max_claimed"])
    if shape["tokens"] is not None:
        Queue.objects.filter(name="agree").update(
            rate_per_second=0.001, rate_burst=5, tokens=shape["tokens"], refilled_at=Now()
        )
    if shape["key_cap"] is not None:
        Queue.objects.filter(name="agree").update(max_claimed_per_key=shape["key_cap"])
    root, _ = queue.create(queue="agree-root", budget={"x": 1})
    if shape["budget_spent"]:
        Todo.objects.filter(pk=root.id).update(budget_exhausted=True)
    todo, _ = queue.create(queue="agree", assignee=shape["assignee"])
    Todo.objects.filter(pk=todo.id).update(root_id=root.id, parent_id=root.id, depth=1)
    state = shape["state"]
    lease = {"owner": "x", "lease_id": "ls_" + "1" * 32, "claimed_at": Now()}
    updates: dict[str, Any] = {
        "pending": {},
        "scheduled_ahead": {"state": "scheduled", "run_at": Now() + timedelta(hours=1)},
        "scheduled_due": {"state": "scheduled", "run_at": Now() - timedelta(seconds=1)},
        "waiting": {"state": "waiting", "waiting_for": {"token": True}},
        "done": {"state": "done", "completed_at": Now()},
        "claimed": {"state": "claimed", "lease_expires_at": Now() + timedelta(minutes=5), "attempt": 1, **lease},
        "lapsed": {"state": "claimed", "lease_expires_at": Now() - timedelta(minutes=5), "attempt": 1, **lease},
    }[state]
    if updates:
        Todo.objects.filter(pk=todo.id).update(**updates)
    return todo


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=_SHAPES)
def test_explain_says_claimable_exactly_when_a_claim_takes_it(agent, shape):
    todo = _shaped(agent, shape)
    said = explain_todo(todo.id, agent=agent)
    try:
        queue.claim(todo.id, agent=agent)
        took = True
    except QueueError:
        took = False
    assert said["claimable"] is took, (shape, said)


def test_a_parked_named_limit_is_a_reason(api, agent):
    from datetime import UTC, datetime

    from todos import flow

    flow.put("openai", max_claimed=5)
    held, _ = queue.create(queue="jobs", limits=["openai"])
    held = queue.claim(held.id, agent=agent)
    waiting, _ = queue.create(queue="jobs", limits=["openai"])
    until = datetime.now(UTC) + timedelta(hours=1)
    queue.park(held.id, agent=agent, lease_id=str(held.lease_id), limit="openai", until=until, reason="429")
    body = api.get(f"/todos/{waiting.id}/explain/").json()
    assert [r["reason"] for r in body["reasons"]] == ["limit_parked"]
    assert body["reasons"][0]["blocked"]["limit"] == "openai"
