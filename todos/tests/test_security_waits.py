"""Hostile agents against waits (issue 28; security review H2, M2, M5, L1's wait rows, L4, L8). Each test
attacks as a compromised agent (or an anonymous client) would, through the API or MCP as it would, and
checks the answer and that nothing changed."""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings

from ingest.models import Route, Source
from ingest.tests.conftest import github_headers, to_body
from todos import limits, queue
from todos.models import Todo, TodoState, Waitpoint
from todos.tests.mcp_live import mcp_base
from todos.tests.test_mcp_tasks import create_task, get_task, modern

__all__ = ["mcp_base"]  # the fixture, imported for pytest

DAY = 24 * 3600
CHECK = {"source": "billing-gh", "type": "*"}
LONGEST_MATCH = limits.WAIT_MATCH_VALUE_MAX_CHARS


def _claimed(api: Any, make_todo: Any, queue_name: str = "sandbox") -> dict[str, Any]:
    todo = make_todo(queue_name)
    answer = api.post(f"/todos/{todo.id}/claim/", {})
    assert answer.status_code == 200, answer.content
    return dict(answer.json())


def _wait(api: Any, claimed: dict[str, Any], wait_for: Any, **extra: Any) -> Any:
    body = {"lease_id": claimed["lease_id"], "for": wait_for, "timeout_seconds": DAY, **extra}
    return api.post(f"/todos/{claimed['id']}/wait/", body)


def _source(slug: str, *, routed_to: str) -> Source:
    source = Source.objects.create(slug=slug, provider="github", secret="topsecret")
    Route.objects.create(source=source, event_pattern="*", queue=routed_to)
    return source


def _unchanged(todo_id: str) -> None:
    """Still claimed, with no wait opened."""
    assert Todo.objects.get(pk=todo_id).state == TodoState.CLAIMED
    assert not Waitpoint.objects.filter(todo_id=todo_id, resolved_at__isnull=True).exists()


@pytest.fixture
def sandbox(make_agent: Any, api_for: Any) -> Any:
    """A compromised agent: its only scope is sandbox."""
    return api_for(make_agent("sandboxed", claim=["sandbox"]))


# --- H2: another tenant's events ------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_event_wait_on_a_source_routed_only_outside_the_scopes_is_404_like_an_unknown_source(sandbox, make_todo):
    _source("billing-gh", routed_to="billing")
    claimed = _claimed(sandbox, make_todo)
    hidden = _wait(sandbox, claimed, {"event": CHECK})
    unknown = _wait(sandbox, claimed, {"event": {**CHECK, "source": "no-such-source"}})
    assert hidden.status_code == unknown.status_code == 404
    assert (
        hidden.json()["error"]["fields"]
        == unknown.json()["error"]["fields"]
        == {"for.event.source": ["No such source."]}
    )
    _unchanged(claimed["id"])


@pytest.mark.django_db
def test_a_delivery_of_another_tenants_source_never_lands_in_the_attackers_todo(
    sandbox, make_todo, make_agent, api_for, client
):
    _source("billing-gh", routed_to="billing")
    claimed = _claimed(sandbox, make_todo)
    _wait(sandbox, claimed, {"event": CHECK})
    body = to_body({"action": "paid", "customer": "cus_secret"})
    assert (
        client.post(
            "/ingest/billing-gh/",
            data=body,
            content_type="application/json",
            headers=github_headers(body, event="invoice", secret="topsecret"),
        ).status_code
        == 202
    )
    leaked = sandbox.get(f"/todos/{claimed['id']}/").json()
    assert leaked["state"] == "claimed" and leaked["resolution"] is None


@pytest.mark.django_db
def test_an_event_wait_on_a_source_routed_into_the_scopes_still_gets_the_payload(sandbox, make_todo, client):
    _source("sandbox-gh", routed_to="sandbox")
    claimed = _claimed(sandbox, make_todo)
    assert _wait(sandbox, claimed, {"event": {"source": "sandbox-gh", "type": "*"}}).status_code == 200
    body = to_body({"action": "opened", "n": 1})
    client.post(
        "/ingest/sandbox-gh/",
        data=body,
        content_type="application/json",
        headers=github_headers(body, event="pull_request", secret="topsecret"),
    )
    resolved = sandbox.get(f"/todos/{claimed['id']}/").json()
    assert resolved["state"] == "pending" and resolved["resolution"]["event"]["payload"] == {"action": "opened", "n": 1}


@pytest.mark.django_db(transaction=True)
def test_the_mcp_wait_tool_refuses_another_tenants_source_too(mcp_base, make_agent, make_todo):
    _source("billing-gh", routed_to="billing")
    attacker = make_agent("sandboxed", claim=["sandbox"])
    todo = queue.claim(make_todo("sandbox").id, agent=attacker)
    args = {"id": todo.id, "lease_id": todo.lease_id, "for": {"event": CHECK}, "timeout_seconds": DAY}
    result = modern(mcp_base, attacker.token, "tools/call", {"name": "wait", "arguments": args}, tasks=False)
    error = json.loads(result["result"]["content"][0]["text"])["error"]
    assert result["result"]["isError"] and error["code"] == "not_found" and "for.event.source" in error["fields"]
    _unchanged(todo.id)


@pytest.mark.django_db
def test_event_waits_opened_before_the_rule_on_unseen_sources_are_ended_by_the_migration(make_agent, make_todo):
    _source("billing-gh", routed_to="billing")
    _source("sandbox-gh", routed_to="sandbox")
    attacker, owner = make_agent("sandboxed", claim=["sandbox"]), make_agent("billing-bot", claim=["billing"])
    waits = {}
    for agent, queue_name, source in ((attacker, "sandbox", "sandbox-gh"), (owner, "billing", "billing-gh")):
        todo = queue.claim(make_todo(queue_name).id, agent=agent)
        queue.wait(
            todo.id, agent=agent, lease_id=todo.lease_id, wait_for={"event": {"source": source}}, timeout_seconds=DAY
        )
        waits[agent.name] = todo.id
    # The attacker's wait as one made before issue 28 could be: on the billing source.
    Waitpoint.objects.filter(todo_id=waits["sandboxed"]).update(event_source="billing-gh")
    migration = importlib.import_module("ingest.migrations.0007_close_event_waits_on_unseen_sources")
    with connection.cursor() as cursor:
        cursor.execute(migration.END_UNSEEN_EVENT_WAITS)
    assert queue.time_out_waits(batch=10) == 1
    ended, kept = Todo.objects.get(pk=waits["sandboxed"]), Todo.objects.get(pk=waits["billing-bot"])
    assert ended.state == TodoState.PENDING and ended.resolution == {**ended.resolution, "timed_out": True}
    assert kept.state == TodoState.WAITING and Waitpoint.objects.get(todo_id=kept.id).event_key is not None


@pytest.mark.django_db
def test_the_other_wait_doors_answer_another_tenants_todo_as_absent(sandbox, make_todo, make_agent):
    # waits on todos, dependencies at create, awaits: each 404 for a todo outside the scopes (the cross-scope
    # results a dependent shows are delegation by design: an agent can only link to todos it can see).
    secret = make_todo("billing")
    claimed = _claimed(sandbox, make_todo)
    assert _wait(sandbox, claimed, {"todos": [secret.id]}).status_code == 404
    assert sandbox.post("/todos/", {"queue": "sandbox", "depends_on": [secret.id]}).status_code == 404
    assert sandbox.get(f"/todos/{secret.id}/", wait_seconds=1).status_code == 404
    _unchanged(claimed["id"])
    assert not Todo.objects.filter(queue="sandbox").exclude(pk=claimed["id"]).exists()


# --- M2: who may resolve is part of the wait ------------------------------------------------------------


@pytest.mark.django_db
def test_the_waiting_agent_cannot_approve_its_own_token_wait(api, make_todo):
    claimed = _claimed(api, make_todo, "jobs")
    token = _wait(api, claimed, {"token": True}).json()["waitpoint"]["token"]
    refused = api.post(f"/todos/{claimed['id']}/resolve/", {"data": {"approved": True}})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.WAITING
    # The person with the token still decides.
    assert (
        Client()
        .post(
            "/api/v1/waitpoints/resolve/",
            {"token": token, "data": {"approved": False}},
            content_type="application/json",
        )
        .status_code
        == 200
    )


@pytest.mark.django_db
def test_another_agent_of_the_queue_cannot_resolve_a_wait_that_does_not_name_it(api, make_todo, make_agent, api_for):
    claimed = _claimed(api, make_todo, "jobs")
    _wait(api, claimed, {"token": True})
    colleague = api_for(make_agent("colleague", claim=["jobs"]))
    assert colleague.post(f"/todos/{claimed['id']}/resolve/", {"data": 1}).status_code == 403
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.WAITING


@pytest.mark.django_db
def test_naming_itself_as_a_resolver_does_not_let_the_waiter_resolve(api, make_todo, agent):
    claimed = _claimed(api, make_todo, "jobs")
    _wait(api, claimed, {"token": True}, resolvers=[agent.name, "scope:*"])
    assert api.post(f"/todos/{claimed['id']}/resolve/", {"data": 1}).status_code == 403
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.WAITING


@pytest.mark.django_db
@pytest.mark.parametrize("named", ["approver", "scope:approvals.*"])
def test_an_agent_the_wait_names_resolves_it_and_the_resolution_says_who(api, make_todo, make_agent, api_for, named):
    claimed = _claimed(api, make_todo, "jobs")
    _wait(api, claimed, {"token": True}, resolvers=[named])
    approver = api_for(make_agent("approver", claim=["approvals.security", "jobs"]))
    answer = approver.post(f"/todos/{claimed['id']}/resolve/", {"data": {"approved": True}})
    assert answer.status_code == 200
    assert answer.json()["resolution"]["by"] == "agent" and answer.json()["resolution"]["resolved_by"] == "approver"


@pytest.mark.django_db
def test_a_staff_operator_with_change_todo_resolves_any_wait(api, make_todo):
    claimed = _claimed(api, make_todo, "jobs")
    _wait(api, claimed, {"token": True})
    operator = User.objects.create_user("ops", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="change_todo"))
    staff = Client(enforce_csrf_checks=False)
    staff.force_login(operator)
    answer = staff.post(f"/api/v1/todos/{claimed['id']}/resolve/", {"data": 1}, content_type="application/json")
    assert answer.status_code == 200
    assert answer.json()["resolution"]["by"] == "operator" and answer.json()["resolution"]["resolved_by"] == "staff:ops"


@pytest.mark.django_db(transaction=True)
def test_mcp_tasks_update_by_the_waiting_agent_is_refused(mcp_base, agent):
    task = create_task(mcp_base, agent.token)
    [claimed] = queue.claim_next(agent=agent)
    queue.wait(claimed.id, agent=agent, lease_id=claimed.lease_id, wait_for={"token": True}, timeout_seconds=DAY)
    [key] = get_task(mcp_base, agent.token, task["taskId"])["result"]["inputRequests"]
    answer = {"action": "accept", "content": {"approved": True}}
    refused = modern(mcp_base, agent.token, "tasks/update", {"taskId": task["taskId"], "inputResponses": {key: answer}})
    assert refused["error"]["code"] == -32602 and refused["error"]["data"]["error"]["code"] == "forbidden"
    assert Todo.objects.get(pk=task["taskId"]).state == TodoState.WAITING


# --- M5 and L1: bounded, storable wait descriptions; bounded errors; a cap on open event waits --------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("wait_for", "field"),
    [
        ({"event": {"source": "a\u0000b"}}, "for.event.source"),
        ({"event": {"source": "gh", "type": "push\u0000"}}, "for.event.type"),
        ({"event": {"source": "gh", "match": {"ref": "main\u0000"}}}, "for.event.match"),
        ({"event": {"source": "gh", "match": {"re\u0000f": "main"}}}, "for.event.match"),
        ({"todos": ["td_\u0000"]}, "for.todos"),
        (
            {"event": {"source": "gh", "match": {"ref": "x" * (limits.WAIT_MATCH_VALUE_MAX_CHARS + 1)}}},
            "for.event.match",
        ),
        ({"event": {"source": "gh", "match": {f"p{i}": "v" * 500 for i in range(9)}}}, "for"),
    ],
)
def test_a_wait_description_that_is_unstorable_or_too_big_is_400_naming_the_field(api, make_todo, wait_for, field):
    claimed = _claimed(api, make_todo, "jobs")
    answer = _wait(api, claimed, wait_for)
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["error"]["fields"]
    _unchanged(claimed["id"])


@pytest.mark.django_db
def test_resolvers_are_bounded_and_never_a_pattern_of_code(api, make_todo):
    claimed = _claimed(api, make_todo, "jobs")
    too_many = [f"a{i}" for i in range(limits.WAIT_RESOLVERS_MAX + 1)]
    wild = "scope:" + "*" * (limits.WAIT_RESOLVER_WILDCARDS_MAX + 1) + "x"
    for resolvers in (too_many, [wild], ["no spaces"], ["bad\u0000"]):
        assert _wait(api, claimed, {"token": True}, resolvers=resolvers).status_code == 400
    _unchanged(claimed["id"])


@pytest.mark.django_db
def test_waiting_again_and_again_keeps_only_the_last_errors(agent, make_todo):
    todo = make_todo("jobs")
    for _ in range(limits.ERRORS_KEPT):  # each round appends two entries: waiting, wait resolved
        claimed = queue.claim(todo.id, agent=agent)
        _, token = queue.wait(
            todo.id, agent=agent, lease_id=claimed.lease_id, wait_for={"token": True}, timeout_seconds=DAY
        )
        queue.resolve_token(token or "")
    errors = Todo.objects.get(pk=todo.id).errors
    assert len(errors) == limits.ERRORS_KEPT and errors[-1]["error"] == "wait resolved"


@pytest.mark.django_db
@override_settings(MAX_OPEN_EVENT_WAITS_PER_AGENT=2)
def test_open_event_waits_per_agent_are_capped_with_429_naming_the_limit(sandbox, make_todo):
    _source("sandbox-gh", routed_to="sandbox")
    event = {"event": {"source": "sandbox-gh", "type": "never.*"}}
    for _ in range(2):
        assert _wait(sandbox, _claimed(sandbox, make_todo), event).status_code == 200
    third = _claimed(sandbox, make_todo)
    refused = _wait(sandbox, third, event)
    assert refused.status_code == 429 and refused.json()["error"]["limit"] == "MAX_OPEN_EVENT_WAITS_PER_AGENT"
    _unchanged(third["id"])
    assert _wait(sandbox, third, {"token": True}).status_code == 200  # other waits are not counted


# --- L4: the waitpoint token out of URLs and logs; a spent token tells nothing ----------------------------


@pytest.mark.django_db
def test_a_spent_token_answers_409_without_the_todos_state(api, make_todo):
    claimed = _claimed(api, make_todo, "jobs")
    token = _wait(api, claimed, {"token": True}).json()["waitpoint"]["token"]
    anyone = Client()
    first = anyone.post("/api/v1/waitpoints/resolve/", {"token": token}, content_type="application/json")
    second = anyone.post(f"/api/v1/waitpoints/{token}/resolve/", {}, content_type="application/json")
    assert (first.status_code, second.status_code) == (200, 409)
    assert "state" not in second.json()["error"]


@pytest.mark.django_db
def test_resolve_url_is_https_when_the_proxy_says_the_request_came_by_https(api, make_todo):
    # Behind a TLS proxy whose X-Forwarded-Proto is not trusted (TRUST_X_FORWARDED_PROTO off), the link must
    # not send the token in clear first: the header only ever upgrades the caller's own link.
    claimed = _claimed(api, make_todo, "jobs")
    body = {"lease_id": claimed["lease_id"], "for": {"token": True}, "timeout_seconds": DAY}
    answer = api.post(f"/todos/{claimed['id']}/wait/", body, HTTP_X_FORWARDED_PROTO="https")
    assert answer.json()["waitpoint"]["resolve_url"].startswith("https://")


@pytest.mark.django_db
def test_a_logged_path_never_holds_a_waitpoint_token():
    [console] = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s"',
        ("10.0.0.1", "POST", "/api/v1/waitpoints/wpt_Qm9vZ2llV29vZ2ll/resolve/"),
        None,
    )
    assert console.filter(record)
    assert "wpt_Qm9v" not in console.format(record) and "wpt_[redacted]" in console.format(record)


# --- L8: MCP tasks/update data is bounded and storable, and every refusal is -32602 with the REST body ------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("content", "code"),
    [({"note": "a\u0000b"}, "invalid"), ({"blob": "x" * (256 * 1024 + 1)}, "too_large")],
)
def test_mcp_tasks_update_refuses_unstorable_or_oversized_data_as_invalid_params(
    mcp_base, agent, make_agent, content, code
):
    task = create_task(mcp_base, agent.token)
    worker = make_agent("worker")
    [claimed] = queue.claim_next(agent=worker)
    queue.wait(
        claimed.id,
        agent=worker,
        lease_id=claimed.lease_id,
        wait_for={"token": True},
        timeout_seconds=DAY,
        resolvers=[agent.name],
    )
    [key] = get_task(mcp_base, agent.token, task["taskId"])["result"]["inputRequests"]
    answer = {"action": "accept", "content": content}
    refused = modern(mcp_base, agent.token, "tasks/update", {"taskId": task["taskId"], "inputResponses": {key: answer}})
    assert refused["error"]["code"] == -32602 and refused["error"]["data"]["error"]["code"] == code
    assert Todo.objects.get(pk=task["taskId"]).state == TodoState.WAITING
