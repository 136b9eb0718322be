"""A2A push notifications in A2A's own format (issue 33): configs given with a message or added to an existing
task with the official a2a-sdk client (Create/Get/List/Delete, JSON-RPC and REST), and each change of the task
POSTed by the notify sidecar as a StreamResponse that the a2a-sdk's own model parses, with the config's token
in X-A2A-Notification-Token, its authentication as Authorization, and a Standard Webhooks signature."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
)
from django.db import connection
from google.protobuf.json_format import Parse
from standardwebhooks import Webhook

from todos import queue
from todos.a2a.tasks import A2AError
from todos.models import A2APushConfig, Agent, Todo
from todos.notices import NOTIFY_QUEUE
from todos.tests.mcp_live import mcp_base
from todos.tests.outbound_receivers import Received, receiver
from todos.tests.test_a2a import JSONRPC, REST, collect, in_thread, run, send, work_it
from todos.tests.test_callbacks import run_notify

__all__ = ["mcp_base", "receiver"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)


def parsed(request: Received, agent: Agent) -> StreamResponse:
    """The delivery as an A2A client reads it: the a2a-sdk's StreamResponse; its signature verified too."""
    agent.refresh_from_db()
    Webhook(agent.webhook_secret).verify(request.body, request.headers)
    return Parse(request.body.decode(), StreamResponse())


def sent_all() -> None:
    while Todo.objects.filter(queue=NOTIFY_QUEUE, state="pending").exists():
        run_notify()


@pytest.mark.parametrize("binding", [JSONRPC, REST])
def test_each_change_of_a_task_is_pushed_as_a_stream_response_with_its_token(mcp_base, agent, receiver, binding):
    async def scenario(client: Any) -> Any:
        request = send("call me back", at_once=True)
        config = TaskPushNotificationConfig(
            url=receiver.url + "/first",
            token="tok-1",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="cred-1"),
        )
        request.configuration.task_push_notification_config.CopyFrom(config)
        [sent] = await collect(client.send_message(request))
        task_id = sent.task.id
        added = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, id="second", url=receiver.url + "/second", token="tok-2")
        )
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id=task_id)
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        await in_thread(work_it(agent, {"done": True}))
        return task_id, added, got, listed

    task_id, added, got, listed = run(mcp_base, agent.token, scenario, streaming=False, binding=binding)
    assert added.id == "second" and added.task_id == task_id and added.token == "tok-2"
    assert got.url == receiver.url + "/first" and got.token == "tok-1" and got.authentication.scheme == "Bearer"
    assert got.authentication.credentials == ""  # never read back
    assert sorted(c.id for c in listed.configs) == sorted([task_id, "second"])
    # A claim (working) and a completion, to each of the two configs; the claim's, overtaken by the
    # completion before the sidecar ran, send nothing.
    assert Todo.objects.filter(queue=NOTIFY_QUEUE, kind="notify.a2a").count() == 4
    sent_all()
    by_path: dict[str, list[Received]] = {}
    for request in receiver.requests:
        by_path.setdefault(request.path, []).append(request)
    assert sorted(by_path) == ["/first", "/second"]
    first = by_path["/first"]
    assert all(r.headers["x-a2a-notification-token"] == "tok-1" for r in first)
    assert all(r.headers["authorization"] == "Bearer cred-1" for r in first)
    assert all(r.headers["x-a2a-notification-token"] == "tok-2" for r in by_path["/second"])
    assert all("authorization" not in r.headers for r in by_path["/second"])
    for requests in by_path.values():
        [final] = [parsed(r, agent) for r in requests]
        assert final.task.id == task_id and final.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert final.task.artifacts[0].parts[0].data.struct_value["done"] is True


@pytest.mark.parametrize("binding", [JSONRPC, REST])
def test_a_deleted_config_is_gone_and_sends_nothing(mcp_base, agent, receiver, binding):
    async def scenario(client: Any) -> Any:
        [sent] = await collect(client.send_message(send("quiet", at_once=True)))
        task_id = sent.task.id
        await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, id="gone", url=receiver.url)
        )
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="gone")
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        await in_thread(work_it(agent, {"done": True}))
        return listed

    listed = run(mcp_base, agent.token, scenario, streaming=False, binding=binding)
    assert list(listed.configs) == []
    sent_all()
    assert receiver.requests == []


def test_working_input_required_submitted_again_and_canceled_are_pushed(mcp_base, agent, make_agent, receiver):
    worker = make_agent("worker", claim=["jobs"])

    async def scenario(client: Any) -> Any:
        request = send("needs a decision", at_once=True)
        request.configuration.task_push_notification_config.CopyFrom(TaskPushNotificationConfig(url=receiver.url))
        [sent] = await collect(client.send_message(request))
        return sent.task.id

    task_id = run(mcp_base, agent.token, scenario, streaming=False)
    [claimed] = queue.claim_next(agent=worker)
    sent_all()
    queue.wait(
        claimed.id,
        agent=worker,
        lease_id=claimed.lease_id,
        wait_for={"token": True},
        timeout_seconds=600,
        resolvers=[agent.name],
    )
    sent_all()
    queue.resolve(task_id, by=agent.name, data={"answer": "yes"}, agent=agent)
    sent_all()
    queue.cancel(task_id, operator="ops", reason="not needed")
    sent_all()
    pushed = [parsed(r, agent) for r in receiver.requests]
    assert len(pushed) == 4 and all(p.status_update.task_id == task_id for p in pushed[:3])
    assert [p.status_update.status.state for p in pushed[:3]] == [
        TaskState.TASK_STATE_WORKING,
        TaskState.TASK_STATE_INPUT_REQUIRED,
        TaskState.TASK_STATE_SUBMITTED,
    ]
    assert "token" in pushed[1].status_update.status.message.parts[0].text
    assert pushed[3].task.id == task_id and pushed[3].task.status.state == TaskState.TASK_STATE_CANCELED


def test_todos_without_a_config_never_call_the_trigger(agent):
    todo, _ = queue.create(queue="jobs", title="plain", agent=agent)
    [claimed] = queue.claim_next(agent=agent)
    queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id, result={})
    assert Todo.objects.get(pk=todo.id).a2a_push is None
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE).exists() and not A2APushConfig.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'todo_enqueues_a2a_push'")
        [definition] = cursor.fetchone()
    assert "new.a2a_push IS TRUE" in definition  # the WHEN: a todo without a config never calls the function


def test_concurrent_adds_to_one_task_stop_at_the_cap(agent, receiver):
    from todos.a2a import push, tasks
    from todos.limits import A2A_MAX_PUSH_CONFIGS

    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "many"}]}
    todo = tasks.send_message(agent, {"message": message}, "jobs")
    barrier = threading.Barrier(A2A_MAX_PUSH_CONFIGS + 4)
    outcomes: list[str] = []

    def add(n: int) -> None:
        try:
            barrier.wait()
            push.create(agent, {"taskId": todo.id, "id": f"c{n}", "url": receiver.url}, "jobs")
            outcomes.append("added")
        except A2AError as exc:
            outcomes.append(str(exc.code))
        finally:
            connection.close()

    threads = [threading.Thread(target=add, args=(n,)) for n in range(A2A_MAX_PUSH_CONFIGS + 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == sorted(["added"] * A2A_MAX_PUSH_CONFIGS + ["-32602"] * 4)
    assert A2APushConfig.objects.filter(todo_id=todo.id).count() == A2A_MAX_PUSH_CONFIGS
