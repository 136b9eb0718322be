"""A2A push notification configs on a task (issue 33; todos/a2a/push.py validates and renders them): adding
one marks its todo (``a2a_push``) so the trigger todo_enqueues_a2a_push fires for it, and removing one. Each
is one short transaction; neither changes the todo's state."""

from __future__ import annotations

from django.db import transaction

from todos import states
from todos.errors import InvalidTransitionInput, TodoConflict, TodoNotFound
from todos.limits import A2A_MAX_PUSH_CONFIGS, notify_max_attempts
from todos.metrics import counted
from todos.models import A2APushConfig, Agent, Todo, new_webhook_secret


@counted("add_push_config")
def add_push_config(
    todo_id: str,
    *,
    agent: Agent,
    config_id: str,
    url: str,
    token: str = "",
    auth_scheme: str = "",
    auth_credentials: str = "",
) -> A2APushConfig:
    """Add (or replace, by ``config_id``) a push config of the caller's task ``todo_id`` (the caller checks it
    is the caller's, todos/a2a/push.py; ``url`` is already through the SSRF guard). In one transaction: the
    UPDATE that marks the todo takes its row lock, so concurrent adds to one task are counted one after the
    other (at most A2A_MAX_PUSH_CONFIGS); a finished todo is refused (TodoConflict): nothing would be sent."""
    with transaction.atomic():
        marked = Todo.objects.filter(pk=todo_id).exclude(states.FINISHED.q).update(a2a_push=True)
        if not marked:
            todo = Todo.objects.filter(pk=todo_id).only("state").first()
            if todo is None:
                raise TodoNotFound(f"Todo {todo_id} not found.")
            raise TodoConflict("The task has finished: there is nothing left to notify.", state=todo.state)
        configs = A2APushConfig.objects.filter(todo_id=todo_id)
        if configs.count() >= A2A_MAX_PUSH_CONFIGS and not configs.filter(config_id=config_id).exists():
            raise InvalidTransitionInput(
                f"A task has at most {A2A_MAX_PUSH_CONFIGS} push notification configs.", field="id"
            )
        if not agent.webhook_secret:  # its first outbound webhook: give it its secret (create_agent shows it)
            Agent.objects.filter(pk=agent.pk, webhook_secret__isnull=True).update(webhook_secret=new_webhook_secret())
        config, _ = A2APushConfig.objects.update_or_create(
            todo_id=todo_id,
            config_id=config_id,
            defaults={
                "agent_id": agent.pk,
                "url": url,
                "token": token,
                "auth_scheme": auth_scheme,
                "auth_credentials": auth_credentials,
                "max_attempts": notify_max_attempts(),
            },
        )
    return config


@counted("delete_push_config", lambda deleted: "ok" if deleted else "absent")
def delete_push_config(todo_id: str, *, config_id: str) -> bool:
    """Remove a push config (the caller checks the task is its own); False if there was none. Deliveries
    already enqueued for it send nothing (the sender finds no config). The todo keeps its mark: the trigger
    then finds no config and enqueues nothing."""
    deleted, _ = A2APushConfig.objects.filter(todo_id=todo_id, config_id=config_id).delete()
    return deleted > 0
