"""Attack tests for issue 33's doors (MCP Tasks on the 2025-11-25 wire, A2A at /a2a and its Agent Card),
each a compromised agent's try, against a live uvicorn server on switchboard.asgi and the test database."""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from todos import queue
from todos.a2a import push as a2a_push
from todos.a2a import tasks as a2a_tasks
from todos.a2a.tasks import A2AError
from todos.mcp.tasks import EXTENSION
from todos.models import A2APushConfig, Todo, TodoState
from todos.notices import NOTIFY_QUEUE
from todos.tests.mcp_live import mcp_base

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db(transaction=True)


def a2a(base: str, token: str | None, method: str, params: dict[str, Any], **headers: str) -> requests.Response:
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return requests.post(base + "/a2a", json=body, headers={**sent, **headers}, timeout=30)


def a2a_message(text: str, **extra: Any) -> dict[str, Any]:
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}], **extra}


def mcp(base: str, token: str, method: str, params: dict[str, Any], version: str) -> dict[str, Any]:
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": version,
    }
    if version == "2026-07-28":
        params = {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
            },
        }
        headers |= {"Mcp-Method": method, "Mcp-Name": str(params.get("taskId", ""))}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer: dict[str, Any] = requests.post(base + "/mcp", json=body, headers=headers, timeout=30).json()
    return answer


@pytest.fixture
def listener() -> Iterator[tuple[str, list[bytes]]]:
    """A loopback HTTP server an agent would like the server to call: it records what reaches it."""
    received: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def test_another_agents_task_is_not_found_on_every_task_protocol(mcp_base, agent, make_agent):
    todo, _ = queue.create(queue="jobs", title="alice's", agent=agent)
    mallory = make_agent("mallory", claim=["other"])
    absent = "td_" + "0" * 26
    for task_id in (todo.id, absent):  # an invisible task reads exactly as one that does not exist
        for version in ("2025-11-25", "2026-07-28"):
            answer = mcp(mcp_base, mallory.token, "tasks/get", {"taskId": task_id}, version)
            assert answer["error"]["code"] == -32602 and "not found" in answer["error"]["message"].lower()
        rpc = a2a(mcp_base, mallory.token, "GetTask", {"id": task_id}).json()
        assert rpc["error"]["code"] == -32001 and rpc["error"]["message"] == "Task not found"
        rest = requests.get(
            f"{mcp_base}/a2a/jobs/tasks/{task_id}", headers={"Authorization": f"Bearer {mallory.token}"}, timeout=30
        )
        assert rest.status_code == 404 and rest.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    cancel = a2a(mcp_base, mallory.token, "CancelTask", {"id": todo.id}).json()
    assert cancel["error"]["code"] == -32001
    assert Todo.objects.get(pk=todo.id).state == TodoState.PENDING


def test_an_a2a_message_to_a_queue_outside_the_create_scopes_makes_nothing(mcp_base, make_agent):
    mallory = make_agent("mallory", claim=["jobs"], create=["jobs"])
    answer = a2a(mcp_base, mallory.token, "SendMessage", {"tenant": "payroll", "message": a2a_message("pay me")}).json()
    assert answer["error"]["code"] == -32602 and "create scopes" in answer["error"]["message"]
    assert not Todo.objects.exists()


def test_a_push_config_to_loopback_is_refused_with_the_guard_on_and_nothing_is_called(
    mcp_base, agent, listener, settings
):
    url, received = listener
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = False  # production's guard (the tests' server allows loopback)
    params = {
        "message": a2a_message("call me back"),
        "configuration": {"taskPushNotificationConfig": {"url": url}, "returnImmediately": True},
    }
    targets = (url, "http://[::1]/hook", "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd")
    for target in targets:
        params["configuration"]["taskPushNotificationConfig"]["url"] = target
        with pytest.raises(A2AError) as refused:
            a2a_tasks.send_message(agent, params, "jobs")
        assert refused.value.code == -32602 and "taskPushNotificationConfig.url" in json.dumps(refused.value.detail)
    assert not Todo.objects.exists()
    # Nor can one be added to an existing task later (the live server runs its own settings: there, with
    # loopback allowed for the tests, a non-http URL stands for what the guard refuses).
    todo = a2a_tasks.send_message(agent, {"message": a2a_message("mine")}, "jobs")
    for target in targets:
        with pytest.raises(A2AError) as refused:
            a2a_push.create(agent, {"taskId": todo.id, "url": target, "token": "t"}, "jobs")
        assert refused.value.code == -32602 and "config.url" in json.dumps(refused.value.detail)
    headers = {"Authorization": f"Bearer {agent.token}"}
    config = {"taskId": todo.id, "url": "file:///etc/passwd", "token": "t"}
    answer = a2a(mcp_base, agent.token, "CreateTaskPushNotificationConfig", config).json()
    assert answer["error"]["code"] == -32602 and "config.url" in json.dumps(answer["error"])
    rest = requests.post(
        f"{mcp_base}/a2a/jobs/tasks/{todo.id}/pushNotificationConfigs", json=config, headers=headers, timeout=30
    )
    assert rest.status_code == 400
    queue.cancel(todo.id, operator="ops", reason="done with it")
    assert not A2APushConfig.objects.exists() and received == []
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE).exists()


def test_an_agent_cannot_read_add_or_delete_push_configs_of_another_agents_task(mcp_base, agent, make_agent, listener):
    url, received = listener
    victim = a2a_tasks.send_message(
        agent, {"message": a2a_message("mine"), "configuration": {"taskPushNotificationConfig": {"url": url}}}, "jobs"
    )
    # Mallory sees the queue (same scopes) but the task is not hers; an in-scope todo made over REST is no
    # A2A task of anyone's either.
    mallory = make_agent("mallory", claim=["jobs"], create=["jobs"])
    plain, _ = queue.create(queue="jobs", title="rest", agent=agent)
    steal = {"taskId": victim.id, "url": url, "id": "mine", "token": "stolen"}
    for task_id in (victim.id, plain.id):
        for method, params in (
            ("CreateTaskPushNotificationConfig", {**steal, "taskId": task_id}),
            ("GetTaskPushNotificationConfig", {"taskId": task_id, "id": victim.id}),
            ("ListTaskPushNotificationConfigs", {"taskId": task_id}),
            ("DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": victim.id}),
        ):
            answer = a2a(mcp_base, mallory.token, method, params).json()
            assert answer["error"]["code"] == -32001, (method, answer)
        rest = requests.get(
            f"{mcp_base}/a2a/jobs/tasks/{task_id}/pushNotificationConfigs",
            headers={"Authorization": f"Bearer {mallory.token}"},
            timeout=30,
        )
        assert rest.status_code == 404
    assert list(A2APushConfig.objects.values_list("todo_id", "config_id", "token")) == [(victim.id, victim.id, "")]
    # Header injection through the token or the credentials is refused at input.
    bad = {"taskId": victim.id, "url": url, "token": "a\r\nX-Evil: 1"}
    assert a2a(mcp_base, agent.token, "CreateTaskPushNotificationConfig", bad).json()["error"]["code"] == -32602
    bad = {"taskId": victim.id, "url": url, "authentication": {"scheme": "Bearer x", "credentials": "y"}}
    assert a2a(mcp_base, agent.token, "CreateTaskPushNotificationConfig", bad).json()["error"]["code"] == -32602
    assert received == []


def test_the_agent_that_waits_cannot_answer_its_own_input_request_over_a2a(mcp_base, agent, make_agent):
    worker = make_agent("worker", claim=["jobs"])
    sent = a2a(
        mcp_base,
        agent.token,
        "SendMessage",
        {"tenant": "jobs", "message": a2a_message("decide"), "configuration": {"returnImmediately": True}},
    ).json()
    task_id = sent["result"]["task"]["id"]
    [claimed] = queue.claim_next(agent=worker)
    queue.wait(claimed.id, agent=worker, lease_id=claimed.lease_id, wait_for={"token": True}, timeout_seconds=600)
    for caller in (worker, agent):  # the waiter never may; the creator only when the wait names it
        params = {"tenant": "jobs", "message": a2a_message("approved", taskId=task_id)}
        answer = a2a(mcp_base, caller.token, "SendMessage", params).json()
        assert answer["error"]["code"] == -32602 and answer["error"]["data"][0]["reason"] == "FORBIDDEN"
    assert Todo.objects.get(pk=task_id).state == TodoState.WAITING


def test_a2a_without_a_valid_token_is_401_and_a_forged_host_400(mcp_base, agent):
    assert a2a(mcp_base, None, "ListTasks", {}).status_code == 401
    assert a2a(mcp_base, "sb_not_a_token", "ListTasks", {}).status_code == 401
    agent.is_active = False
    agent.save()
    assert a2a(mcp_base, agent.token, "ListTasks", {}).status_code == 401
    forged = a2a(mcp_base, None, "ListTasks", {}, Host="evil.example")
    assert forged.status_code == 400 and "evil.example" not in forged.text


def test_an_a2a_body_over_the_limit_is_413_before_it_is_read(mcp_base, agent, settings):
    headers = {"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"}
    huge = b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"x":"' + b"a" * 3_000_000 + b'"}}'
    response = requests.post(mcp_base + "/a2a", data=huge, headers=headers, timeout=30)
    assert response.status_code == 413
    assert not Todo.objects.exists()


def test_the_agent_card_reads_nothing_and_is_the_same_for_any_queue_name(mcp_base, agent):
    queue.create(queue="jobs", title="exists")
    existing = requests.get(mcp_base + "/.well-known/agent-card.json?queue=jobs", timeout=10).json()
    missing = requests.get(mcp_base + "/.well-known/agent-card.json?queue=nope", timeout=10).json()
    assert existing["name"].replace("jobs", "Q") == missing["name"].replace("nope", "Q")
    assert existing["capabilities"] == missing["capabilities"]
    bad = requests.get(mcp_base + "/.well-known/agent-card.json?queue=%3Cscript%3E", timeout=10)
    assert bad.status_code == 400 and "<script>" not in bad.text


def test_an_agent_cannot_plant_a_todo_in_another_agents_task_lists_over_rest(mcp_base, api, make_agent):
    victim = make_agent("victim", claim=["jobs"])
    for source in (f"mcp-task:{victim.pk}", f"a2a:{victim.pk}"):
        one = api.post("/todos/", {"queue": "jobs", "source": source})
        assert one.status_code == 400 and "source" in one.json()["error"]["fields"]
        batch = api.post("/todos/batch/", {"todos": [{"queue": "jobs", "source": source}]})
        assert batch.status_code == 400 and "todos.0.source" in batch.json()["error"]["fields"]
    assert not Todo.objects.exists()
    listed = mcp(mcp_base, victim.token, "tasks/list", {}, "2025-11-25")["result"]["tasks"]
    assert listed == [] and a2a(mcp_base, victim.token, "ListTasks", {}).json()["result"]["tasks"] == []


def test_a_todo_in_scope_that_is_not_the_callers_task_is_no_task_on_the_2025_wire(mcp_base, agent):
    todo, _ = queue.create(queue="jobs", title="made over REST", agent=agent)
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        answer = mcp(mcp_base, agent.token, method, {"taskId": todo.id}, "2025-11-25")
        assert answer["error"]["code"] == -32602 and "not found" in answer["error"]["message"].lower()
    assert Todo.objects.get(pk=todo.id).state == TodoState.PENDING


def test_waiting_task_results_and_streams_hold_no_thread(mcp_base, agent):
    """24 waits (12 tasks/result, 12 A2A streams) on a server of 8 pool threads: other requests are still
    answered at once, and every wait is answered when its todo finishes."""
    params = {"name": "create_for", "arguments": {"queue": "jobs"}, "task": {}}
    mcp_task = mcp(mcp_base, agent.token, "tools/call", params, "2025-11-25")["result"]["task"]["taskId"]
    sent = a2a(
        mcp_base,
        agent.token,
        "SendMessage",
        {"tenant": "jobs", "message": a2a_message("stream"), "configuration": {"returnImmediately": True}},
    ).json()
    a2a_task = sent["result"]["task"]["id"]
    answered: list[str] = []

    def await_result() -> None:
        answer = mcp(mcp_base, agent.token, "tasks/result", {"taskId": mcp_task}, "2025-11-25")
        answered.append("result" if answer["result"]["isError"] is False else "error")

    def stream() -> None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": a2a_task}}
        headers = {"Authorization": f"Bearer {agent.token}"}
        with requests.post(mcp_base + "/a2a", json=body, headers=headers, stream=True, timeout=60) as response:
            for line in response.iter_lines(decode_unicode=True):
                if "TASK_STATE_COMPLETED" in line:
                    answered.append("stream")
                    return

    waiters = [threading.Thread(target=await_result) for _ in range(12)]
    waiters += [threading.Thread(target=stream) for _ in range(12)]
    for waiter in waiters:
        waiter.start()
    time.sleep(1.5)
    started = time.monotonic()
    assert mcp(mcp_base, agent.token, "tasks/get", {"taskId": mcp_task}, "2025-11-25")["result"]["status"] == "working"
    assert requests.get(mcp_base + "/healthz", timeout=10).status_code == 200
    assert time.monotonic() - started < 3, "a request waited for a thread held by a waiting one"
    for todo in queue.claim_next(agent=agent, limit=2):
        queue.complete(todo.id, agent=agent, lease_id=todo.lease_id, result={})
    for waiter in waiters:
        waiter.join(timeout=30)
    assert sorted(answered) == ["result"] * 12 + ["stream"] * 12
