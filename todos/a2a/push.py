"""A2A push notification configs (issue 33): where an A2A client is told of its task's changes, in A2A's
own format.

* A config (``TaskPushNotificationConfig``: ``url``, optional ``id``, ``token`` and ``authentication``) is
  given with a message (``configuration.taskPushNotificationConfig``) or added to an existing task
  (``CreateTaskPushNotificationConfig``); Get/List/Delete read and remove them. Each names only the
  caller's own tasks (those it created over A2A, in its scopes): another's task is TaskNotFound. Each URL
  passes the SSRF guard (``check_outbound_url``) when given, and again on every send. At most
  A2A_MAX_PUSH_CONFIGS per task; ``id`` defaults to the task's id (as the a2a-sdk's stores do).
* Each change of the task's A2A state (submitted again, working on a claim or a wait, input-required,
  completed, failed, canceled) enqueues one delivery per config in the same transaction (the trigger
  todo_enqueues_a2a_push, only for todos with a config), sent by the notify sidecar (todos/outbound.py,
  channel ``a2a``): an HTTP POST of a ``StreamResponse`` (``statusUpdate``; the whole ``task`` with its
  artifact once finished), the config's ``token`` in ``X-A2A-Notification-Token`` and its ``authentication``
  as ``Authorization: <scheme> <credentials>`` (as the a2a-sdk's sender sends them), and a Standard Webhooks
  signature under the agent's ``webhook_secret`` beside them. It follows no redirect (the credentials go to
  the URL given).
* Read back, a config shows its token and its authentication's scheme, never its credentials.
"""

from __future__ import annotations

import re
from typing import Any

from todos import queue, states
from todos.a2a.tasks import A2AError, from_queue_error, invalid, source_of, task_not_found, task_of, visible
from todos.a2a.tasks import status_update as status_update_of
from todos.errors import InvalidTransitionInput, QueueError
from todos.limits import A2A_MAX_PUSH_ID_CHARS, A2A_MAX_PUSH_SECRET_CHARS
from todos.models import A2APushConfig, Agent, Todo
from todos.notices import check_outbound_url

CONFIG_ID_RE = re.compile(rf"^[A-Za-z0-9._:-]{{1,{A2A_MAX_PUSH_ID_CHARS}}}$")
SCHEME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")  # an HTTP auth scheme: a token (RFC 9110)
HEADER_VALUE_RE = re.compile(rf"^[\x20-\x7e]{{0,{A2A_MAX_PUSH_SECRET_CHARS}}}$")  # printable ASCII: no CR/LF

NOT_FOUND = A2AError(-32001, 404, "Push notification config not found", "TASK_NOT_FOUND")


def own_task(agent: Agent, task_id: Any, tenant: str | None) -> Todo:
    """The caller's own A2A task (created by it over A2A, in its scopes): any other reads as absent."""
    todo = visible(agent, task_id, tenant)
    if todo.source != source_of(agent):
        raise task_not_found()
    return todo


def _string(config: dict[str, Any], name: str, pattern: re.Pattern[str], at: str) -> str:
    value = config.get(name, "")
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not pattern.match(value):
        raise invalid(f"{at} is not valid (printable ASCII, bounded).", fields={at: ["Not valid."]})
    return value


def parsed(config: Any, at: str) -> dict[str, str]:
    """A TaskPushNotificationConfig's fields, validated (``at``: where it sits in the request, for the 400)."""
    if not isinstance(config, dict):
        raise invalid(f"{at} must be an object.", fields={at: ["Must be an object."]})
    url = config.get("url")
    try:
        check_outbound_url(url if isinstance(url, str) else "", field=f"{at}.url")
    except InvalidTransitionInput as exc:
        raise invalid(exc.detail, **exc.extra) from None
    auth = config.get("authentication") or {}
    if not isinstance(auth, dict):
        raise invalid(f"{at}.authentication must be an object.", fields={f"{at}.authentication": ["Not valid."]})
    scheme = _string(auth, "scheme", SCHEME_RE, f"{at}.authentication.scheme")
    credentials = _string(auth, "credentials", HEADER_VALUE_RE, f"{at}.authentication.credentials")
    if credentials and not scheme:
        raise invalid(f"{at}.authentication.scheme is required with credentials.")
    return {
        "config_id": _string(config, "id", CONFIG_ID_RE, f"{at}.id"),
        "url": str(url),
        "token": _string(config, "token", HEADER_VALUE_RE, f"{at}.token"),
        "auth_scheme": scheme,
        "auth_credentials": credentials,
    }


def rendered(config: A2APushConfig, todo: Todo) -> dict[str, Any]:
    """A config as Get/List/Create answer it: its token, its authentication's scheme, never its credentials."""
    shown: dict[str, Any] = {"tenant": todo.queue, "id": config.config_id, "taskId": todo.id, "url": config.url}
    if config.token:
        shown["token"] = config.token
    if config.auth_scheme:
        shown["authentication"] = {"scheme": config.auth_scheme}
    return shown


def add(agent: Agent, todo: Todo, fields: dict[str, str]) -> A2APushConfig:
    try:
        return queue.add_push_config(todo.id, agent=agent, **{**fields, "config_id": fields["config_id"] or todo.id})
    except QueueError as exc:
        if exc.code == "conflict":
            raise A2AError(-32004, 400, exc.detail, "UNSUPPORTED_OPERATION") from None
        raise from_queue_error(exc) from None


def create(agent: Agent, params: dict[str, Any], tenant: str | None, task_id: Any = None) -> dict[str, Any]:
    """CreateTaskPushNotificationConfig: ``params`` is the config (its ``taskId``, or the REST path's)."""
    todo = own_task(agent, task_id or params.get("taskId"), tenant)
    return rendered(add(agent, todo, parsed(params, "config")), todo)


def get(agent: Agent, params: dict[str, Any], tenant: str | None) -> dict[str, Any]:
    todo = own_task(agent, params.get("taskId"), tenant)
    config = A2APushConfig.objects.filter(todo_id=todo.id, config_id=str(params.get("id") or todo.id)[:200]).first()
    if config is None:
        raise NOT_FOUND
    return rendered(config, todo)


def listed(agent: Agent, params: dict[str, Any], tenant: str | None) -> dict[str, Any]:
    """ListTaskPushNotificationConfigs: all of them (at most A2A_MAX_PUSH_CONFIGS: one page)."""
    todo = own_task(agent, params.get("taskId"), tenant)
    configs = A2APushConfig.objects.filter(todo_id=todo.id).order_by("created_at", "id")
    return {"configs": [rendered(config, todo) for config in configs], "nextPageToken": ""}


def delete(agent: Agent, params: dict[str, Any], tenant: str | None) -> dict[str, Any]:
    todo = own_task(agent, params.get("taskId"), tenant)
    if not queue.delete_push_config(todo.id, config_id=str(params.get("id") or todo.id)[:200]):
        raise NOT_FOUND
    return {}


def body_of(todo: Todo) -> dict[str, Any]:
    """A push delivery's body, a StreamResponse: the whole task once it has finished (its artifact with it),
    else its status update."""
    if states.FINISHED.holds(todo):
        return {"task": task_of(todo)}
    return status_update_of(todo)
