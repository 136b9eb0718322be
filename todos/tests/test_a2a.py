"""A2A v1.0 at /a2a (issue 33 item 3), driven by the official a2a-sdk client (pinned in
requirements-dev.txt) against a live uvicorn server on switchboard.asgi and the test database: the Agent
Card per queue, messages that become todos, streaming, cancel, and the input-required round trip, over
JSON-RPC and the REST binding."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import requests
from a2a.client import ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError
from django.db import connection

from todos import queue
from todos.models import Agent, Todo, TodoState
from todos.tests.mcp_live import mcp_base

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)

JSONRPC, REST = "JSONRPC", "HTTP+JSON"


def card_path(queue_name: str) -> str:
    return f"/.well-known/agent-card.json?queue={queue_name}"


def run(base: str, token: str, scenario: Callable[[Any], Awaitable[Any]], **options: Any) -> Any:
    """``scenario(client)`` with the official client for queue ``jobs`` (or ``queue=``), built from its card."""
    queue_name = options.pop("queue", "jobs")
    binding = options.pop("binding", JSONRPC)

    async def main() -> Any:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], **options)
            client = await create_client(base, client_config=config, relative_card_path=card_path(queue_name))
            return await scenario(client)

    return asyncio.run(main())


def message(text: str, *, task_id: str = "", message_id: str = "") -> Message:
    return Message(
        message_id=message_id or uuid.uuid4().hex, role="ROLE_USER", parts=[Part(text=text)], task_id=task_id
    )


def send(text: str, *, at_once: bool = False, **kw: Any) -> SendMessageRequest:
    configuration = SendMessageConfiguration(return_immediately=at_once)
    return SendMessageRequest(message=message(text, **kw), configuration=configuration)


async def collect(events: Any) -> list[StreamResponse]:
    return [event async for event in events]


def in_thread(work: Callable[[], Any]) -> Awaitable[Any]:
    """``work`` (the ORM: a worker's side) in a thread of its own, whose connection it closes."""

    def closing() -> Any:
        try:
            return work()
        finally:
            connection.close()

    return asyncio.to_thread(closing)


def work_it(agent: Agent, result: dict[str, Any]) -> Callable[[], Todo]:
    """A worker: claim the next todo of jobs (waiting for it), report progress, complete it."""

    def work() -> Todo:
        todos: list[Todo] = []
        for _ in range(100):
            todos = queue.claim_next(agent=agent)
            if todos:
                break
            asyncio.run(asyncio.sleep(0.05))
        [claimed] = todos
        queue.heartbeat(claimed.id, agent=agent, lease_id=claimed.lease_id, progress={"message": "half way"})
        return queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id, result=result)

    return work


# --- the Agent Card -----------------------------------------------------------------------------


def test_the_agent_card_names_the_queue_as_tenant_on_both_bindings(mcp_base):
    card = requests.get(mcp_base + card_path("reviews"), timeout=10).json()
    interfaces = {i["protocolBinding"]: i for i in card["supportedInterfaces"]}
    assert set(interfaces) == {JSONRPC, REST}
    assert all(i["tenant"] == "reviews" and i["url"] == mcp_base + "/a2a" for i in interfaces.values())
    assert card["capabilities"] == {"streaming": True, "pushNotifications": True}
    assert requests.get(mcp_base + "/.well-known/agent-card.json", timeout=10).status_code == 400


# --- messages and tasks over JSON-RPC ------------------------------------------------------------------


def test_a_message_creates_a_todo_once_per_message_id(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        first = await collect(client.send_message(send("review PR 7", at_once=True, message_id="m-1")))
        again = await collect(client.send_message(send("review PR 7", at_once=True, message_id="m-1")))
        return first[0].task, again[0].task

    first, again = run(mcp_base, agent.token, scenario, streaming=False)
    todo = Todo.objects.get()
    assert first.id == again.id == todo.id and first.status.state == TaskState.TASK_STATE_SUBMITTED
    assert todo.queue == "jobs" and todo.title == "review PR 7" and todo.kind == "a2a"
    stored = todo.payload["message"]
    assert stored["messageId"] == "m-1" and stored["parts"] == [{"text": "review PR 7"}]
    assert first.context_id == todo.payload["message"]["contextId"] and first.history[0].message_id == "m-1"


def test_a_blocking_send_answers_once_the_todo_is_done_with_its_result_as_artifact(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        sent = asyncio.ensure_future(collect(client.send_message(send("summarise"))))
        await in_thread(work_it(agent, {"summary": "ok"}))
        return (await sent)[0].task

    task = run(mcp_base, agent.token, scenario, streaming=False)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].data.struct_value["summary"] == "ok"


def test_streaming_follows_the_todo_from_submitted_to_completed(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        streamed = asyncio.ensure_future(collect(client.send_message(send("stream me"))))
        await in_thread(work_it(agent, {"n": 1}))
        return await streamed

    events = run(mcp_base, agent.token, scenario)
    assert events[0].HasField("task") and events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    assert set(states) <= {TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_COMPLETED}
    [artifact] = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert artifact.artifact.parts[0].data.struct_value["n"] == 1


def test_get_list_and_cancel_a_task(mcp_base, agent, make_agent):
    bob = make_agent("bob", claim=["jobs"])
    run(mcp_base, bob.token, lambda c: collect(c.send_message(send("bob's", at_once=True))), streaming=False)

    async def scenario(client: Any) -> Any:
        [sent] = await collect(client.send_message(send("cancel me", at_once=True)))
        got = await client.get_task(GetTaskRequest(id=sent.task.id))
        listed = await client.list_tasks(ListTasksRequest())
        cancelled = await client.cancel_task(CancelTaskRequest(id=sent.task.id))
        try:
            await client.cancel_task(CancelTaskRequest(id=sent.task.id))
            again: Any = None
        except TaskNotCancelableError as exc:
            again = exc
        await collect(client.send_message(send("keep me", at_once=True)))
        by_state = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_CANCELED))
        return sent.task.id, got, listed, cancelled, again, by_state

    task_id, got, listed, cancelled, again, by_state = run(mcp_base, agent.token, scenario, streaming=False)
    assert [t.id for t in by_state.tasks] == [task_id]  # filtered in SQL by the states table's rows
    assert got.id == task_id and got.status.state == TaskState.TASK_STATE_SUBMITTED
    assert [t.id for t in listed.tasks] == [task_id]  # the caller's tasks only
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED and isinstance(again, TaskNotCancelableError)
    assert Todo.objects.get(pk=task_id).state == TodoState.CANCELLED


def test_input_required_is_resolved_by_a_follow_up_message(mcp_base, agent, make_agent):
    worker = make_agent("worker", claim=["jobs"])

    async def scenario(client: Any) -> Any:
        [sent] = await collect(client.send_message(send("needs a decision", at_once=True)))
        task_id = sent.task.id

        def wait_for_input() -> None:
            [claimed] = queue.claim_next(agent=worker)
            queue.wait(
                claimed.id,
                agent=worker,
                lease_id=claimed.lease_id,
                wait_for={"token": True},
                timeout_seconds=600,
                resolvers=[agent.name],
            )

        await in_thread(wait_for_input)
        waiting = await client.get_task(GetTaskRequest(id=task_id))
        [answered] = await collect(client.send_message(send("approved", task_id=task_id, at_once=True)))
        return task_id, waiting, answered.task

    task_id, waiting, answered = run(mcp_base, agent.token, scenario, streaming=False)
    assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert "token" in waiting.status.message.parts[0].text
    assert answered.id == task_id and answered.status.state == TaskState.TASK_STATE_SUBMITTED
    [claimed] = queue.claim_next(agent=worker)
    assert claimed.id == task_id
    assert claimed.resolution["data"]["message"]["parts"] == [{"text": "approved"}]


def test_a_message_to_a_task_that_needs_no_input_is_refused(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        [sent] = await collect(client.send_message(send("working", at_once=True)))
        try:
            await collect(client.send_message(send("more", task_id=sent.task.id, at_once=True)))
        except UnsupportedOperationError as exc:
            return exc
        return None

    assert isinstance(run(mcp_base, agent.token, scenario, streaming=False), UnsupportedOperationError)


def test_resubscribe_streams_a_running_task_to_its_end(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        [sent] = await collect(client.send_message(send("watch me", at_once=True)))
        watched = asyncio.ensure_future(collect(client.subscribe(SubscribeToTaskRequest(id=sent.task.id))))
        await in_thread(work_it(agent, {"ok": True}))
        events = await watched
        try:
            await collect(client.subscribe(SubscribeToTaskRequest(id=sent.task.id)))
            finished: Any = None
        except (UnsupportedOperationError, A2AClientError) as exc:
            finished = exc
        return events, finished

    events, finished = run(mcp_base, agent.token, scenario)
    assert events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert finished is not None  # a finished task has nothing to subscribe to


# --- the REST binding ------------------------------------------------------------------------------------


def test_the_rest_binding_sends_streams_gets_lists_and_cancels(mcp_base, agent):
    async def scenario(client: Any) -> Any:
        streamed = asyncio.ensure_future(collect(client.send_message(send("over REST"))))
        await in_thread(work_it(agent, {"via": "rest"}))
        events = await streamed
        [sent] = await collect(client.send_message(send("cancel over REST", at_once=True)))
        got = await client.get_task(GetTaskRequest(id=events[0].task.id))
        listed = await client.list_tasks(ListTasksRequest())
        cancelled = await client.cancel_task(CancelTaskRequest(id=sent.task.id))
        try:
            await client.get_task(GetTaskRequest(id="td_" + "0" * 26))
            missing: Any = None
        except TaskNotFoundError as exc:
            missing = exc
        return events, got, listed, cancelled, missing

    events, got, listed, cancelled, missing = run(mcp_base, agent.token, scenario, binding=REST)
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert got.artifacts[0].parts[0].data.struct_value["via"] == "rest"
    assert len(listed.tasks) == 2 and cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert isinstance(missing, TaskNotFoundError)


def test_concurrent_resends_of_one_message_make_one_todo(mcp_base, agent):
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "tenant": "jobs",
            "message": {"messageId": "same", "role": "ROLE_USER", "parts": [{"text": "once"}]},
            "configuration": {"returnImmediately": True},
        },
    }
    headers = {"Authorization": f"Bearer {agent.token}"}
    barrier = threading.Barrier(8)
    answers: list[str] = []

    def resend() -> None:
        barrier.wait()
        answer = requests.post(mcp_base + "/a2a", json=body, headers=headers, timeout=30).json()
        answers.append(answer["result"]["task"]["id"])

    threads = [threading.Thread(target=resend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == 8 and len(set(answers)) == 1
    assert Todo.objects.count() == 1
