"""A todo's callback (issue 29): given on create (REST, batch, MCP's create arguments), stored on the todo,
and when the todo is done or dead-lettered a signed todo.done / todo.dead_lettered webhook with its JSON,
enqueued in the same transaction (the trigger todo_enqueues_callback) and sent by the notify sidecar."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from standardwebhooks import Webhook

from todos import queue
from todos.models import Agent, Todo
from todos.notices import NOTIFY_QUEUE
from todos.tests.mcp_live import mcp_base
from todos.tests.test_mcp_tools import error, ok, run

__all__ = ["mcp_base"]  # the fixture, imported for pytest


def run_notify() -> str:
    out = StringIO()
    call_command("notify", "--once", stdout=out)
    return out.getvalue()


def test_a_callback_after_complete_is_signed_with_the_creators_secret(api, agent, receiver):
    response = api.post("/todos/", {"queue": "jobs", "title": "t", "callback": {"url": receiver.url + "/cb"}})
    assert response.status_code == 201, response.content
    todo_id = response.json()["id"]
    assert Todo.objects.filter(queue=NOTIFY_QUEUE).count() == 0  # nothing until it is done
    [claimed] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert (
        api.post(f"/todos/{todo_id}/complete/", {"lease_id": claimed["lease_id"], "result": {"ok": 1}}).status_code
        == 200
    )
    [delivery] = Todo.objects.filter(queue=NOTIFY_QUEUE)
    assert delivery.payload["event"] == "todo.done" and delivery.payload["todo"] == todo_id
    assert run_notify() == "sent=1 failed=0\n"
    [request] = receiver.requests
    agent.refresh_from_db()
    assert agent.webhook_secret and agent.webhook_secret.startswith("whsec_")
    body = Webhook(agent.webhook_secret).verify(request.body, request.headers)
    assert body["type"] == "todo.done"
    assert body["data"]["id"] == todo_id and body["data"]["state"] == "done" and body["data"]["result"] == {"ok": 1}


def test_a_callback_after_dead_letter(api, agent, receiver):
    todo_id = api.post(
        "/todos/", {"queue": "jobs", "max_attempts": 1, "callback": {"url": receiver.url, "events": ["dead_lettered"]}}
    ).json()["id"]
    [claimed] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    assert api.post(f"/todos/{todo_id}/fail/", {"lease_id": claimed["lease_id"], "error": "boom"}).status_code == 200
    assert run_notify() == "sent=1 failed=0\n"
    agent.refresh_from_db()
    body = Webhook(agent.webhook_secret).verify(receiver.requests[0].body, receiver.requests[0].headers)
    assert body["type"] == "todo.dead_lettered" and body["data"]["dead_letter"] is True
    assert body["data"]["errors"][-1]["error"] == "boom"


def test_an_event_the_callback_does_not_want_sends_nothing(api, receiver):
    todo_id = api.post(
        "/todos/", {"queue": "jobs", "callback": {"url": receiver.url, "events": ["dead_lettered"]}}
    ).json()["id"]
    [claimed] = api.post("/todos/claim/", {"queues": ["jobs"]}).json()["todos"]
    api.post(f"/todos/{todo_id}/complete/", {"lease_id": claimed["lease_id"]})
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE).exists()


def test_a_plain_create_stores_no_callback_and_completing_it_enqueues_nothing(agent):
    todo, _ = queue.create(queue="jobs", agent=agent)
    assert todo.callback is None
    [claimed] = queue.claim_next(agent=agent, queues=["jobs"])
    assert claimed.lease_id is not None
    queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id)
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE).exists()


def test_a_rolled_back_completion_enqueues_nothing(agent, receiver):
    from django.db import transaction

    todo, _ = queue.create(queue="jobs", agent=agent, callback={"url": receiver.url})
    [claimed] = queue.claim_next(agent=agent, queues=["jobs"])
    assert claimed.lease_id is not None
    try:
        with transaction.atomic():
            queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id)
            assert Todo.objects.filter(queue=NOTIFY_QUEUE).count() == 1  # in the same transaction
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE).exists()


def test_batch_items_take_a_callback_and_bad_ones_name_the_item(api, receiver):
    ok = api.post("/todos/batch/", {"todos": [{"queue": "jobs"}, {"queue": "jobs", "callback": {"url": receiver.url}}]})
    assert ok.status_code == 200, ok.content
    stored = [Todo.objects.get(id=o["id"]).callback for o in ok.json()["outcomes"]]
    assert stored[0] is None and stored[1]["url"] == receiver.url and stored[1]["events"] == ["done", "dead_lettered"]
    bad = api.post("/todos/batch/", {"todos": [{"queue": "jobs"}, {"queue": "jobs", "callback": {"url": "ftp://x"}}]})
    assert bad.status_code == 400
    assert "todos.1.callback.url" in json.dumps(bad.json())


def test_create_agent_shows_its_webhook_secret(db):
    out, err = StringIO(), StringIO()
    call_command("create_agent", "producer", "--queues", "jobs", stdout=out, stderr=err)
    secret = Agent.objects.get(name="producer").webhook_secret
    assert secret and secret.startswith("whsec_") and secret in err.getvalue() and secret not in out.getvalue()


@pytest.mark.django_db(transaction=True)  # the live server reads the agent from its own connection
def test_mcp_create_for_takes_a_callback_and_refuses_a_bad_one_naming_it(mcp_base, agent, receiver):
    async def scenario(client: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        made = ok(await client.call_tool("create_for", {"queue": "jobs", "callback": {"url": receiver.url}}))
        refused = error(
            await client.call_tool("create_for", {"queue": "jobs", "callback": {"url": "file:///etc/passwd"}})
        )
        return made, refused

    made, refused = run(mcp_base, agent.token, scenario)
    assert Todo.objects.get(pk=made["todo"]["id"]).callback["url"] == receiver.url
    assert "callback.url" in json.dumps(refused)
    assert Todo.objects.count() == 1


def test_a_callback_of_a_todo_too_big_to_send_whole_leaves_its_payload_and_result_out(agent, receiver):
    big = "x" * 200_000
    todo, _ = queue.create(queue="jobs", agent=agent, payload={"big": big}, callback={"url": receiver.url})
    [claimed] = queue.claim_next(agent=agent, queues=["jobs"])
    assert claimed.lease_id is not None
    queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id, result={"big": big})
    assert run_notify() == "sent=1 failed=0\n"
    data = json.loads(receiver.requests[0].body)["data"]
    assert data["id"] == todo.id and data["truncated"] is True and data["payload"] is None and data["result"] is None


def test_a_lease_lapsing_at_its_cap_in_the_reaper_calls_back_dead_lettered(agent, receiver):
    from datetime import timedelta

    from django.db.models.functions import Now

    todo, _ = queue.create(queue="jobs", agent=agent, max_attempts=1, callback={"url": receiver.url})
    queue.claim_next(agent=agent, queues=["jobs"])
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    queue.reap_once(batch=100)
    [delivery] = Todo.objects.filter(queue=NOTIFY_QUEUE)
    assert (delivery.payload["event"], delivery.payload["todo"]) == ("todo.dead_lettered", todo.id)
    assert run_notify() == "sent=1 failed=0\n"
    assert json.loads(receiver.requests[0].body)["data"]["errors"][-1]["error"] == "lease expired"
