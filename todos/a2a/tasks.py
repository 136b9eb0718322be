"""Todos as A2A v1.0 tasks (issue 33 item 3): a message creates a todo, the todo is the task.

* The task's id is the todo's id; its state is the todo's row of ``states.TASK_STATES``. Its history is
  the message that created it (kept as the todo's payload, ``{"message": ...}``), its artifact the
  todo's result once done, its status message the worker's progress, the wait's reason, or the last error.
* A message creates a todo in the queue its request names (A2A's ``tenant``: the Agent Card of
  ``/.well-known/agent-card.json?queue=NAME`` names it), within the caller's create scopes, idempotent by
  the message's id (the idempotency key ``a2a:<agent key>:<messageId>``: a resent message is that task).
* A follow-up message naming a task that needs input (a wait for a token, a person or a manual resolve)
  resolves the wait with ``{"message": ...}`` as its data, only when the caller may resolve it under
  issue 28's rules (queue.resolve decides: never the agent that waits).
* A message's ``configuration.taskPushNotificationConfig`` is the task's first push config, added in the
  todo's create transaction; todos/a2a/push.py adds, reads and removes them later, and says what is sent.
* Tasks are the caller's: ``ListTasks`` lists the todos it created over A2A (``source`` ``a2a:<agent
  key>``) within its scopes; ``GetTask`` and ``CancelTask`` reach any todo its scopes show, as REST does.

Every function here is sync and runs in the pool (switchboard/executor.py); todos/a2a/server.py serves
them, and waits for changes on the loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from switchboard import ids
from todos import queue, states
from todos.api.fields import _iso
from todos.api.serializers import ResolveInput, TodoCreateInput
from todos.errors import QueueError
from todos.limits import A2A_MAX_MESSAGE_ID_CHARS, A2A_MAX_PARTS, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT
from todos.models import Agent, Todo

KIND = "a2a"


@dataclass
class A2AError(Exception):
    """An A2A error: its JSON-RPC code, its REST binding's HTTP status, and a message."""

    code: int
    status: int
    message: str
    reason: str = ""
    detail: dict[str, Any] | None = None


def task_not_found() -> A2AError:
    return A2AError(-32001, 404, "Task not found", "TASK_NOT_FOUND")


def invalid(message: str, **detail: Any) -> A2AError:
    return A2AError(-32602, 400, message, "INVALID_PARAMS", detail or None)


def from_queue_error(exc: QueueError) -> A2AError:
    """A refusal of the queue as A2A's error: not found stays TaskNotFound (ids do not leak); the rest is
    invalid params carrying REST's code and detail."""
    if exc.code == "not_found":
        return task_not_found()
    status = 429 if exc.code == "throttled" else 403 if exc.code == "forbidden" else 400
    return A2AError(-32602, status, exc.detail, exc.code.upper(), {"code": exc.code, **exc.extra})


def source_of(agent: Agent) -> str:
    return f"a2a:{agent.pk}"


# --- rendering ----------------------------------------------------------------------------------------


def _message_of(todo: Todo) -> dict[str, Any] | None:
    message = todo.payload.get("message") if isinstance(todo.payload, dict) else None
    return message if isinstance(message, dict) else None


def context_of(todo: Todo) -> str:
    message = _message_of(todo)
    context = message.get("contextId") if message else None
    return context if isinstance(context, str) and context else todo.id


def _note(todo: Todo, row: states.TaskState) -> str:
    if row in (states.TASK_DEAD, states.TASK_CANCELLED):
        last = todo.errors[-1] if todo.errors else {}
        return str(last.get("reason") or last.get("error") or row.todo)
    if row is states.TASK_INPUT:
        return f"Waiting for input: {', '.join(sorted(todo.waiting_for or {}))}."
    progress = todo.progress.get("message") if isinstance(todo.progress, dict) else None
    return str(progress or "")


def status_of(todo: Todo) -> dict[str, Any]:
    row = states.task_state(todo)
    status: dict[str, Any] = {"state": row.a2a, "timestamp": _iso(todo.updated_at)}
    if note := _note(todo, row):
        status["message"] = {
            "messageId": f"{todo.id}.{todo.updated_at.timestamp():.6f}",
            "role": "ROLE_AGENT",
            "parts": [{"text": note}],
            "taskId": todo.id,
            "contextId": context_of(todo),
        }
    return status


def artifact_of(todo: Todo) -> dict[str, Any]:
    return {"artifactId": "result", "name": "result", "parts": [{"data": todo.result}]}


def task_of(todo: Todo) -> dict[str, Any]:
    """The todo as an A2A v1.0 Task (ProtoJSON)."""
    task: dict[str, Any] = {
        "id": todo.id,
        "contextId": context_of(todo),
        "status": status_of(todo),
        "metadata": {"queue": todo.queue, "todoState": states.label(todo)},
    }
    if (message := _message_of(todo)) is not None:
        task["history"] = [message]
    if todo.state == states.TodoState.DONE:
        task["artifacts"] = [artifact_of(todo)]
    return task


def status_update(todo: Todo) -> dict[str, Any]:
    return {"statusUpdate": {"taskId": todo.id, "contextId": context_of(todo), "status": status_of(todo)}}


def artifact_update(todo: Todo) -> dict[str, Any]:
    update = {"taskId": todo.id, "contextId": context_of(todo), "artifact": artifact_of(todo), "lastChunk": True}
    return {"artifactUpdate": update}


def ends_a_stream(todo: Todo) -> bool:
    """A stream ends once its task is finished or interrupted (needs input), as A2A asks."""
    return states.FINISHED.holds(todo) or states.task_state(todo) is states.TASK_INPUT


# --- the operations -------------------------------------------------------------------------------


def _message(params: dict[str, Any]) -> dict[str, Any]:
    message = params.get("message")
    if not isinstance(message, dict):
        raise invalid("message (an object) is required.")
    message_id = message.get("messageId")
    if not isinstance(message_id, str) or not 1 <= len(message_id) <= A2A_MAX_MESSAGE_ID_CHARS:
        raise invalid(f"message.messageId must be 1-{A2A_MAX_MESSAGE_ID_CHARS} characters.")
    parts = message.get("parts")
    if not isinstance(parts, list) or not 1 <= len(parts) <= A2A_MAX_PARTS:
        raise invalid(f"message.parts must be a list of 1-{A2A_MAX_PARTS} parts.")
    if message.get("role") not in ("ROLE_USER", "user"):
        raise invalid("message.role must be ROLE_USER.")
    for name in ("taskId", "contextId"):
        if name in message and not isinstance(message[name], str):
            raise invalid(f"message.{name} must be a string.")
    return message


def _title(message: dict[str, Any]) -> str:
    for part in message["parts"]:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and text.strip():
            return text.strip()[:200]
    return ""


def visible(agent: Agent, task_id: Any, tenant: str | None) -> Todo:
    if not isinstance(task_id, str) or not ids.is_id(task_id, ids.TODO):
        raise task_not_found()
    todos = Todo.objects.visible_to(agent).filter(pk=task_id)
    if tenant:
        todos = todos.filter(queue=tenant)
    todo = todos.first()
    if todo is None:
        raise task_not_found()
    return todo


def send_message(agent: Agent, params: dict[str, Any], tenant: str | None) -> Todo:
    """A new message: create its todo (or find the one a resend made). A follow-up (message.taskId):
    resolve the task's wait for input with the message."""
    message = _message(params)
    if message.get("taskId"):
        return _follow_up(agent, message, tenant)
    if not tenant:
        raise invalid("The queue is required: the tenant of the Agent Card (?queue=NAME) names it.")
    message = {**message, "contextId": message.get("contextId") or f"ctx_{uuid.uuid4().hex}"}
    data: dict[str, Any] = {
        "queue": tenant,
        "kind": KIND,
        "title": _title(message),
        "payload": {"message": message},
        "idempotency_key": f"a2a:{agent.pk}:{message['messageId']}",
    }
    push = _push_config(params)
    create = TodoCreateInput(data=data)
    if not create.is_valid():
        raise invalid("The message cannot be a todo.", fields=create.errors)
    try:
        with transaction.atomic():
            todo, _ = queue.create(agent=agent, **{**create.validated_data, "source": source_of(agent)})
            if push is not None:
                from todos.a2a import push as pushes

                pushes.add(agent, todo, push)
    except QueueError as exc:
        raise from_queue_error(exc) from None
    return todo


def _push_config(params: dict[str, Any]) -> dict[str, str] | None:
    """The message's ``configuration.taskPushNotificationConfig``, if any, validated (todos/a2a/push.py)."""
    from todos.a2a import push

    configuration = params.get("configuration")
    config = configuration.get("taskPushNotificationConfig") if isinstance(configuration, dict) else None
    if not config:
        return None
    return push.parsed(config, "taskPushNotificationConfig")


def _follow_up(agent: Agent, message: dict[str, Any], tenant: str | None) -> Todo:
    todo = visible(agent, message["taskId"], tenant)
    if states.task_state(todo) is not states.TASK_INPUT:
        # A finished task takes no more messages; a working one needs none (A2A: UnsupportedOperation).
        raise A2AError(-32004, 400, "The task is not waiting for input.", "UNSUPPORTED_OPERATION")
    resolve = ResolveInput(data={"data": {"message": message}})
    if not resolve.is_valid():
        raise invalid("The message cannot resolve the wait.", fields=resolve.errors)
    try:
        # Only a resolver the wait names (or an operator) may: never the agent that waits (issue 28).
        return queue.resolve(todo.id, by=agent.name, data=resolve.validated_data["data"], agent=agent)
    except QueueError as exc:
        raise from_queue_error(exc) from None


def cancel(agent: Agent, params: dict[str, Any], tenant: str | None) -> Todo:
    todo = visible(agent, params.get("id"), tenant)
    if not states.CANCELLABLE.holds(todo):
        raise A2AError(-32002, 400, "Task cannot be canceled: it has finished.", "TASK_NOT_CANCELABLE")
    try:
        return queue.cancel(todo.id, operator=agent.name, reason="A2A CancelTask", agent=agent)
    except QueueError as exc:
        if exc.code == "conflict":
            raise A2AError(-32002, 400, "Task cannot be canceled: it has finished.", "TASK_NOT_CANCELABLE") from None
        raise from_queue_error(exc) from None


def _page_token(value: Any) -> Q | None:
    if not value:
        return None
    try:
        created, todo_id = json.loads(base64.urlsafe_b64decode(str(value)[:200].encode()))
        at = parse_datetime(created)
    except (ValueError, TypeError, binascii.Error):
        at = None
    if at is None or not isinstance(todo_id, str):
        raise invalid("Invalid pageToken.")
    return Q(created_at__lt=at) | Q(created_at=at, id__lt=todo_id)


def list_tasks(agent: Agent, params: dict[str, Any], tenant: str | None) -> dict[str, Any]:
    """The caller's A2A tasks in its scopes (and the tenant's queue), newest first, keyset-paged."""
    size = params.get("pageSize") or DEFAULT_LIST_LIMIT
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_LIST_LIMIT:
        raise invalid(f"pageSize must be an integer from 1 to {MAX_LIST_LIMIT}.")
    todos = Todo.objects.visible_to(agent).filter(source=source_of(agent))
    if tenant:
        todos = todos.filter(queue=tenant)
    if isinstance(context := params.get("contextId"), str) and context:
        todos = todos.filter(payload__message__contextId=context)
    if (after := _page_token(params.get("pageToken"))) is not None:
        todos = todos.filter(after)
    if state := params.get("status"):
        # The one table of todos/states.py, as a filter: a state no todo is ever in matches nothing.
        condition = states.a2a_state_q(state) if isinstance(state, str) else None
        todos = todos.filter(condition) if condition is not None else todos.none()
    rows = list(todos.order_by("-created_at", "-id")[: size + 1])
    answer: dict[str, Any] = {"tasks": [task_of(todo) for todo in rows[:size]], "pageSize": size, "nextPageToken": ""}
    if len(rows) > size:
        last = rows[size - 1]
        answer["nextPageToken"] = base64.urlsafe_b64encode(
            json.dumps([last.created_at.isoformat(), last.id]).encode()
        ).decode()
    return answer


def refused(exc: serializers.ValidationError) -> A2AError:
    return invalid("The request is invalid.", fields=exc.detail)
