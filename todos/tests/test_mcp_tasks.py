"""Todos as MCP Tasks (issue 21): the io.modelcontextprotocol/tasks extension of the 2026-07-28 revision
(SEP-2663), in raw JSON-RPC against a live uvicorn server on switchboard.asgi and the test database."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import requests

from todos import queue
from todos.mcp.tasks import EXTENSION
from todos.models import Todo, TodoState
from todos.tests.mcp_live import mcp_base

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)

VERSION = "2026-07-28"


def modern(base: str, token: str, method: str, params: dict[str, Any], *, tasks: bool = True) -> dict[str, Any]:
    """One 2026-07-28 request (per-request envelope in _meta), declaring the tasks extension if ``tasks``."""
    capabilities: dict[str, Any] = {"extensions": {EXTENSION: {}}} if tasks else {}
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    name = params.get("name") or params.get("taskId")
    if name:
        headers["Mcp-Name"] = name  # tools/call's tool, tasks/*'s task id (the extension's routing header)
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    response = requests.post(base + "/mcp", json=body, headers=headers, timeout=30)
    answer: dict[str, Any] = response.json()
    # The SDK's transport answers a JSON-RPC error with HTTP 400, a result with 200.
    assert response.status_code == (400 if "error" in answer else 200), response.text
    return answer


def create_task(base: str, token: str, **arguments: Any) -> dict[str, Any]:
    answer = modern(base, token, "tools/call", {"name": "create_for", "arguments": {"queue": "jobs", **arguments}})
    return dict(answer["result"])


def get_task(base: str, token: str, task_id: str) -> dict[str, Any]:
    return modern(base, token, "tasks/get", {"taskId": task_id})


def test_the_server_declares_the_tasks_extension(mcp_base, agent):
    answer = modern(mcp_base, agent.token, "server/discover", {})
    assert EXTENSION in answer["result"]["capabilities"]["extensions"]


def test_create_for_with_the_extension_answers_a_task_whose_id_is_the_todos(mcp_base, agent):
    task = create_task(mcp_base, agent.token, title="review PR 7")
    todo = Todo.objects.get()
    assert task["resultType"] == "task" and task["taskId"] == todo.id and task["status"] == "working"
    assert {"createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} <= set(task)
    assert "result" not in task and "content" not in task


def test_without_the_extension_create_for_answers_the_plain_tool_result(mcp_base, agent):
    answer = modern(
        mcp_base, agent.token, "tools/call", {"name": "create_for", "arguments": {"queue": "jobs"}}, tasks=False
    )
    result = answer["result"]
    assert result["resultType"] == "complete" and result["isError"] is False
    assert result["structuredContent"]["todo"]["id"] == Todo.objects.get().id


def test_get_while_working_shows_the_progress_message_then_completed_with_the_result(mcp_base, agent):
    task = create_task(mcp_base, agent.token)
    got = get_task(mcp_base, agent.token, task["taskId"])["result"]
    assert got["resultType"] == "complete" and got["status"] == "working" and "statusMessage" not in got

    [claimed] = queue.claim_next(agent=agent)
    queue.heartbeat(claimed.id, agent=agent, lease_id=claimed.lease_id, progress={"percent": 60, "message": "3/5"})
    got = get_task(mcp_base, agent.token, task["taskId"])["result"]
    assert got["status"] == "working" and got["statusMessage"] == "3/5"

    queue.complete(claimed.id, agent=agent, lease_id=claimed.lease_id, result={"verdict": "approve"})
    got = get_task(mcp_base, agent.token, task["taskId"])["result"]
    assert got["status"] == "completed"
    assert got["result"]["isError"] is False
    assert got["result"]["structuredContent"]["todo"]["result"] == {"verdict": "approve"}


def test_a_dead_letter_is_failed_with_the_error(mcp_base, agent):
    task = create_task(mcp_base, agent.token)
    Todo.objects.filter(pk=task["taskId"]).update(max_attempts=1)
    [claimed] = queue.claim_next(agent=agent)
    queue.fail(claimed.id, agent=agent, lease_id=claimed.lease_id, error="the build is red")
    got = get_task(mcp_base, agent.token, task["taskId"])["result"]
    assert got["status"] == "failed" and got["error"]["message"] == "the build is red"
    assert got["statusMessage"] == "the build is red"


def test_tasks_cancel_cancels_the_todo(mcp_base, agent):
    task = create_task(mcp_base, agent.token)
    answer = modern(mcp_base, agent.token, "tasks/cancel", {"taskId": task["taskId"]})
    assert answer["result"]["resultType"] == "complete"
    assert Todo.objects.get(pk=task["taskId"]).state == TodoState.CANCELLED
    assert get_task(mcp_base, agent.token, task["taskId"])["result"]["status"] == "cancelled"


def test_another_agents_task_is_not_found_and_cannot_be_cancelled(mcp_base, agent, make_agent):
    task = create_task(mcp_base, agent.token)
    mallory = make_agent("mallory", claim=["other"])
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        params: dict[str, Any] = {"taskId": task["taskId"]}
        if method == "tasks/update":
            params["inputResponses"] = {}
        answer = modern(mcp_base, mallory.token, method, params)
        assert answer["error"]["code"] == -32602, answer
    assert Todo.objects.get(pk=task["taskId"]).state == TodoState.PENDING


def test_an_unknown_task_id_is_invalid_params(mcp_base, agent):
    assert get_task(mcp_base, agent.token, "td_" + "0" * 32)["error"]["code"] == -32602
    assert get_task(mcp_base, agent.token, "not-a-todo")["error"]["code"] == -32602


def test_tasks_methods_without_the_extension_are_missing_capability(mcp_base, agent):
    task = create_task(mcp_base, agent.token)
    answer = modern(mcp_base, agent.token, "tasks/get", {"taskId": task["taskId"]}, tasks=False)
    assert answer["error"]["code"] == -32021
    assert answer["error"]["data"]["requiredCapabilities"]["extensions"] == {EXTENSION: {}}


def _wait(agent, wait_for: dict[str, Any], **kw: Any) -> Todo:
    [claimed] = queue.claim_next(agent=agent)
    waited, _ = queue.wait(
        claimed.id, agent=agent, lease_id=claimed.lease_id, wait_for=wait_for, timeout_seconds=3600, **kw
    )
    return waited


def test_waiting_on_a_token_is_input_required_and_update_resolves_it(mcp_base, agent, make_agent):
    task = create_task(mcp_base, agent.token)
    # A worker takes the task and asks its creator (named as a resolver: issue 28) for input.
    _wait(make_agent("worker"), {"token": True}, resolvers=[agent.name])
    got = get_task(mcp_base, agent.token, task["taskId"])["result"]
    assert got["status"] == "input_required"
    [(key, request)] = got["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert get_task(mcp_base, agent.token, task["taskId"])["result"]["inputRequests"].keys() == {key}  # stable

    stale = {"taskId": task["taskId"], "inputResponses": {"resolve-0": {"action": "accept", "content": {}}}}
    assert modern(mcp_base, agent.token, "tasks/update", stale)["result"]["resultType"] == "complete"
    assert Todo.objects.get(pk=task["taskId"]).state == TodoState.WAITING  # not outstanding: ignored

    answer = {"action": "accept", "content": {"approved": True}}
    ack = modern(mcp_base, agent.token, "tasks/update", {"taskId": task["taskId"], "inputResponses": {key: answer}})
    assert ack["result"]["resultType"] == "complete"
    todo = Todo.objects.get(pk=task["taskId"])
    assert todo.state == TodoState.PENDING and todo.resolution["data"] == {"approved": True}
    assert get_task(mcp_base, agent.token, task["taskId"])["result"]["status"] == "working"


def test_waiting_on_other_todos_is_working(mcp_base, agent, make_todo):
    task = create_task(mcp_base, agent.token)
    child = make_todo("children")
    claimed = queue.claim(task["taskId"], agent=agent)
    waited, _ = queue.wait(
        claimed.id, agent=agent, lease_id=claimed.lease_id, wait_for={"todos": [child.id]}, timeout_seconds=3600
    )
    assert waited.state == TodoState.WAITING
    got = get_task(mcp_base, agent.token, task["taskId"])["result"]
    assert got["status"] == "working" and "inputRequests" not in got


def test_get_todo_with_wait_seconds_answers_when_the_todo_is_done(mcp_base, agent, make_todo):
    todo = make_todo("jobs")
    out: dict[str, Any] = {}

    def call() -> None:
        started = time.monotonic()
        args = {"id": todo.id, "wait_seconds": 15}
        out["answer"] = modern(mcp_base, agent.token, "tools/call", {"name": "get_todo", "arguments": args})
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)
    claimed = queue.claim(todo.id, agent=agent)
    queue.complete(todo.id, agent=agent, lease_id=claimed.lease_id, result={"ok": 1})
    thread.join(15)
    result = out["answer"]["result"]
    assert result["structuredContent"]["todo"]["state"] == "done" and out["seconds"] < 5


def test_get_todo_with_wait_seconds_over_20_is_invalid_naming_it(mcp_base, agent, make_todo):
    todo = make_todo("jobs")
    args = {"id": todo.id, "wait_seconds": 21}
    result = modern(mcp_base, agent.token, "tools/call", {"name": "get_todo", "arguments": args})["result"]
    assert result["isError"] is True and "wait_seconds" in json.loads(result["content"][0]["text"])["error"]["fields"]


def _tool(base: str, token: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = modern(base, token, "tools/call", {"name": name, "arguments": arguments}, tasks=False)["result"]
    return {"error": result["isError"], **json.loads(result["content"][0]["text"])}


def test_the_heartbeat_tool_records_progress_and_a_checkpoint_under_the_receipt(mcp_base, agent, make_todo):
    todo = make_todo("jobs")
    claimed = queue.claim(todo.id, agent=agent)
    beat = {"id": todo.id, "lease_id": claimed.lease_id, "progress": {"percent": 25}, "checkpoint": {"page": 2}}
    answer = _tool(mcp_base, agent.token, "heartbeat", beat)
    assert not answer["error"] and answer["todo"]["progress"] == {"percent": 25.0}
    stale = _tool(mcp_base, agent.token, "heartbeat", {**beat, "lease_id": "ls_" + "0" * 32, "checkpoint": {"x": 1}})
    assert stale["error"] and stale["error"]["code"] == "conflict"
    bad = _tool(mcp_base, agent.token, "heartbeat", {**beat, "progress": {"percent": 150}})
    assert bad["error"] and "progress" in bad["error"]["fields"]
    got = _tool(mcp_base, agent.token, "get_todo", {"id": todo.id})["todo"]
    assert got["checkpoint"] == {"page": 2} and got["progress"] == {"percent": 25.0}
