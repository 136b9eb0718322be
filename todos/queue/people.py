"""Waits for people (issue 29): the wait's people part, a person's decision, an operator's reassignment,
and the reaper's reminders and escalations. Statements in todos/sql/people.py; what a wait for people is,
todos/people/spec.py; who is told, todos/people/notify.py."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from psycopg.types.json import Jsonb

from todos import limits, sql, tracing
from todos.errors import AlreadyDecided, InvalidTransitionInput, NotAResolver, TodoConflict, TodoNotFound
from todos.metrics import TRANSITIONS, counted
from todos.models import Agent, Todo, Waitpoint
from todos.people import notify
from todos.people import schema as edit_schema
from todos.people.spec import PeopleSpec
from todos.queue.lease import with_receipt
from todos.rows import fetch_todos, fetchall


def _ids(model: type[User] | type[Group], names: list[str], at: str) -> list[int]:
    """The ids of users (active) or groups by name, in order; a 400 naming ``at`` for one that is not."""
    if not names:
        return []
    if model is User:
        found = dict(User.objects.filter(username__in=names, is_active=True).values_list("username", "pk"))
    else:
        found = dict(Group.objects.filter(name__in=names).values_list("name", "pk"))
    if missing := [n for n in names if n not in found]:
        kind = "an active user" if model is User else "a group"
        raise InvalidTransitionInput(f"{missing[0][:150]!r} is not {kind}.", field=at)
    return [int(found[n]) for n in names]


def wait_for_people(todo_id: str, *, agent: Agent, lease_id: str, asked: PeopleSpec, params: dict[str, Any]) -> Todo:
    """The people part of queue.wait, in one transaction: the named users and groups must exist (400
    naming the field), the wait opens (sql.WAIT, with its deciders and reminder/escalation times), and the
    people are told (notice ``wait:<id>:asked``), all committing together."""
    with transaction.atomic():
        user_ids = _ids(User, asked.users, "for.people.users")
        group_ids = _ids(Group, asked.groups, "for.people.groups")
        escalate_ids = _ids(Group, asked.escalate_groups, "for.people.escalate_to.groups")
        todo = with_receipt(
            sql.WAIT,
            "wait",
            todo_id,
            agent,
            lease_id,
            **{
                **params,
                "people": Jsonb(asked.stored()),
                "decider_users": user_ids,
                "decider_groups": group_ids,
                "escalate_groups": escalate_ids,
                "remind_after": asked.remind_after,
                "escalate_after": asked.escalate_after,
            },
        )
        opened = Waitpoint.objects.get(pk=todo_id)
        notify.tell(
            "asked",
            todo_id=todo_id,
            wait_created_at=opened.created_at,
            timeout_at=opened.timeout_at,
            people=asked.stored(),
            user_ids=user_ids,
            group_ids=group_ids,
            key_suffix=f":{opened.created_at.timestamp():.6f}",
        )
        return todo


def may_decide(user: Any, wait: Waitpoint) -> bool:
    """The rule of sql.DECIDE's guard, for pages (the statement is what enforces it)."""
    if not user.is_authenticated or not user.is_active:
        return False
    if is_operator(user) or user.pk in wait.decider_users:
        return True
    groups = set(user.groups.values_list("pk", flat=True))
    return bool(groups & set(wait.decider_groups)) or (
        wait.escalated_at is not None and bool(groups & set(wait.escalate_groups))
    )


def is_operator(user: Any) -> bool:
    """Staff with Django's todos.change_todo (superusers have every permission)."""
    return bool(user.is_active and user.is_staff and user.has_perm("todos.change_todo"))


def _checked(wait: Waitpoint, decision: Any, edited: Any, text: Any) -> dict[str, Any]:
    people = wait.people or {}
    if decision not in people.get("decisions", []):
        raise InvalidTransitionInput(
            f"decision must be one of {', '.join(people.get('decisions', []))}.", field="decision"
        )
    if not isinstance(text, str) or len(text) > limits.PEOPLE_TEXT_MAX_CHARS or "\x00" in text:
        raise InvalidTransitionInput(f"text is up to {limits.PEOPLE_TEXT_MAX_CHARS} characters.", field="text")
    if decision == "respond" and not text.strip():
        raise InvalidTransitionInput("A response needs its text.", field="text")
    if decision == "edit":
        edited = edit_schema.validate(edited, people["edit_schema"])
    elif edited is not None:
        raise InvalidTransitionInput('edited goes with the decision "edit".', field="edited")
    return {"decision": decision, "edited": edited if decision == "edit" else None, "text": text}


@counted("decide")
@tracing.traced("decide")
def decide(todo_id: str, *, user: Any, decision: Any, edited: Any = None, text: Any = "") -> Todo:
    """waiting -> pending by a person's decision on a wait for people, exactly once: a user the wait names,
    a member of a group it names (or of an escalation group once escalated), or an operator (staff with
    todos.change_todo). The resolution: {by: "person", decision, edited, text, decided_by, at}. Refused:
    NotAResolver (403) for anyone else; AlreadyDecided (409, who and when) once someone decided;
    InvalidTransitionInput (400) for a decision the wait does not allow or edited arguments its schema
    refuses. Nothing changes when refused."""
    wait = Waitpoint.objects.filter(pk=todo_id, people__isnull=False).first()
    if wait is None:
        raise TodoNotFound(f"No wait for people on {todo_id}.")
    detail = {**_checked(wait, decision, edited, text), "decided_by": user.get_username()}
    rows = fetch_todos(
        sql.DECIDE,
        {
            "id": todo_id,
            "created_at": wait.created_at,
            "decision": detail["decision"],
            "username": user.get_username(),
            "operator": is_operator(user),
            "user_id": user.pk if user.is_active else -1,
            "groups": list(user.groups.values_list("pk", flat=True)) if user.is_active else [],
            "detail": Jsonb(detail),
        },
    )
    if rows:
        return rows[0]
    raise _refused(todo_id, wait, user)


def _refused(todo_id: str, seen: Waitpoint, user: Any) -> Exception:
    now = Waitpoint.objects.filter(pk=todo_id).first()
    if now is None:
        return TodoNotFound(f"No wait for people on {todo_id}.")
    if now.created_at != seen.created_at:
        return TodoConflict("This question was replaced by a newer one; reload it.", state="waiting")
    if now.resolved_at is not None:
        if now.decided_by:
            at = now.resolved_at.isoformat()
            return AlreadyDecided(
                f"Already decided by {now.decided_by} at {at}.", decided_by=now.decided_by, decided_at=at
            )
        return TodoConflict("This wait has ended (it timed out, or its todo was cancelled).", state="ended")
    if not may_decide(user, now):
        return NotAResolver("Only the people this wait names, or an operator, may decide it.")
    todo = Todo.objects.filter(pk=todo_id).first()
    return TodoConflict("Its todo no longer waits.", state=todo.state if todo else "gone")


@counted("reassign")
def reassign(todo_id: str, *, by: str, users: list[str], groups: list[str]) -> list[str]:
    """An operator's reassignment of an open wait for people: these users and groups decide it from now
    on, recorded in the todo's history (who, to whom), and told (a notice ``wait:<id>:reassigned``).
    Returns the notices' delivery ids. Callers check the operator (is_operator)."""
    if not users and not groups:
        raise InvalidTransitionInput("Name at least one user or group.", field="users")
    if len(users) + len(groups) > limits.PEOPLE_MAX_NAMED:
        raise InvalidTransitionInput(f"Up to {limits.PEOPLE_MAX_NAMED} names.", field="users")
    with transaction.atomic():
        user_ids, group_ids = _ids(User, users, "users"), _ids(Group, groups, "groups")
        rows = fetchall(
            sql.REASSIGN,
            {
                "id": todo_id,
                "user_ids": user_ids,
                "group_ids": group_ids,
                "users": Jsonb(users),
                "groups": Jsonb(groups),
                "what": "people reassigned",
                "entry": Jsonb({"by": by, "users": users, "groups": groups}),
            },
        )
        if not rows:
            raise TodoConflict(f"{todo_id} has no open wait for people.", state="ended")
        ((_, created_at, timeout_at, people),) = rows
        return notify.tell(
            "reassigned",
            todo_id=todo_id,
            wait_created_at=created_at,
            timeout_at=timeout_at,
            people=_json(people),
            user_ids=user_ids,
            group_ids=group_ids,
            key_suffix=f":{len(Todo.objects.get(pk=todo_id).errors)}",
        )


def _json(value: Any) -> Any:
    """A jsonb column as fetchall hands it back (text on the sweeps' raw cursor)."""
    return json.loads(value) if isinstance(value, str) else value


def _sweep(statement: str, what: str, *, batch: int) -> int:
    with transaction.atomic():
        rows = fetchall(statement, {"batch": batch, "what": f"people {what}", "entry": Jsonb({})})
        for todo_id, created_at, timeout_at, people, user_ids, group_ids, escalate_ids in rows:
            escalated = what == "escalated"
            notify.tell(
                what,
                todo_id=todo_id,
                wait_created_at=created_at,
                timeout_at=timeout_at,
                people=_json(people),
                user_ids=[] if escalated else user_ids,
                group_ids=escalate_ids if escalated else group_ids,
                key_suffix=f":{created_at.timestamp():.6f}",
            )
    if rows:
        TRANSITIONS.labels(verb=f"people_{what}", outcome="ok").inc(len(rows))
    return len(rows)


def remind_people(*, batch: int) -> int:
    """One batch of open people waits whose reminder is due: reminded once each (reminded_at), recorded in
    the todo's history, the deciders told again (wait:<id>:reminded), in one transaction."""
    return _sweep(sql.REMIND_PEOPLE, "reminded", batch=batch)


def escalate_people(*, batch: int) -> int:
    """One batch of open people waits whose escalation is due: escalated once each (escalated_at: the
    escalation groups' members may decide from now on), recorded in the history, those groups told."""
    return _sweep(sql.ESCALATE_PEOPLE, "escalated", batch=batch)


def delete_expired_links(*, batch: int) -> int:
    """One batch of decision links past their expiry: deleted (they open nothing any more)."""
    with transaction.atomic():
        return len(fetchall(sql.DELETE_EXPIRED_LINKS, {"batch": batch}))
