"""``for: {"people": {...}}`` (issue 29), parsed once for every door (REST and MCP ``wait``, the client).

    {"users": [usernames], "groups": [group names],      who may decide (at least one name)
     "title": "...", "body": "markdown, <= 8 KB",         the question
     "decisions": ["approve", "reject", "edit", "respond"],
     "edit_schema": {...}, "arguments": {...},            with "edit": what may change, and its proposal
     "remind_after_seconds": n, "escalate_after_seconds": n, "escalate_to": {"groups": [...]}}

Names are checked against the database by the wait (todos/queue/people.py: a 400 naming the field for a
name that is not an active user or a group). Every bound is in todos/limits.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from todos import limits
from todos.errors import InvalidTransitionInput
from todos.people import schema as edit_schema

DECISIONS = ("approve", "reject", "edit", "respond")
_KEYS = {
    "users",
    "groups",
    "title",
    "body",
    "decisions",
    "edit_schema",
    "arguments",
    "remind_after_seconds",
    "escalate_after_seconds",
    "escalate_to",
}
_NAME_MAX = 150  # Django's username and group name


def _bad(detail: str, name: str) -> InvalidTransitionInput:
    return InvalidTransitionInput(detail, field=name)


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _names(value: Any, at: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limits.PEOPLE_MAX_NAMED:
        raise _bad(f"{at.rsplit('.', 1)[-1]} lists up to {limits.PEOPLE_MAX_NAMED} names.", at)
    if not all(isinstance(n, str) and 1 <= len(n) <= _NAME_MAX and "\x00" not in n for n in value):
        raise _bad("Each name is 1 to 150 characters.", at)
    return list(dict.fromkeys(value))


def _seconds(value: Any, at: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad("A number of seconds.", at)
    if not limits.PEOPLE_REMIND_MIN_SECONDS <= value <= limits.WAIT_TIMEOUT_MAX_SECONDS:
        raise _bad(f"Between {limits.PEOPLE_REMIND_MIN_SECONDS} and {limits.WAIT_TIMEOUT_MAX_SECONDS} seconds.", at)
    return float(value)


@dataclass(frozen=True)
class PeopleSpec:
    users: list[str]
    groups: list[str]
    title: str
    body: str
    decisions: list[str]
    edit_schema: dict[str, Any] | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    remind_after: float | None = None
    escalate_after: float | None = None
    escalate_groups: list[str] = field(default_factory=list)

    def stored(self) -> dict[str, Any]:
        """What the waitpoint keeps (Waitpoint.people): the question as asked."""
        return {
            "users": self.users,
            "groups": self.groups,
            "title": self.title,
            "body": self.body,
            "decisions": self.decisions,
            "edit_schema": self.edit_schema,
            # jsonb keeps an object's keys in its own order: the form's fields keep the agent's.
            "field_order": list((self.edit_schema or {}).get("properties", {})),
            "arguments": self.arguments,
            "remind_after_seconds": self.remind_after,
            "escalate_after_seconds": self.escalate_after,
            "escalate_to": {"groups": self.escalate_groups},
        }

    def shown(self) -> dict[str, Any]:
        """waiting_for: short (it is copied into errors); the body and arguments stay on the waitpoint."""
        return {
            "people": {"users": self.users, "groups": self.groups, "title": self.title, "decisions": self.decisions}
        }


def parse(value: Any) -> PeopleSpec:
    """A people wait's spec, checked: InvalidTransitionInput names the field at fault."""
    at = "for.people"
    if not isinstance(value, dict):
        raise _bad("people must be an object with users or groups, title and decisions.", at)
    if unknown := sorted(set(value) - _KEYS):
        raise _bad(f"Unknown field {unknown[0][:60]!r}.", f"{at}.{unknown[0][:60]}")
    if _size(value) > limits.PEOPLE_WAIT_MAX_BYTES:
        raise _bad(f"people is at most {limits.PEOPLE_WAIT_MAX_BYTES} bytes as JSON.", at)
    users, groups = _names(value.get("users"), f"{at}.users"), _names(value.get("groups"), f"{at}.groups")
    if not users and not groups:
        raise _bad("Name at least one user or group who may decide.", f"{at}.users")
    if len(users) + len(groups) > limits.PEOPLE_MAX_NAMED:
        raise _bad(f"users and groups name up to {limits.PEOPLE_MAX_NAMED} together.", f"{at}.users")
    title = value.get("title")
    if not (isinstance(title, str) and 1 <= len(title) <= limits.PEOPLE_TITLE_MAX_CHARS and title.isprintable()):
        raise _bad(f"title is 1 to {limits.PEOPLE_TITLE_MAX_CHARS} printable characters.", f"{at}.title")
    body = value.get("body", "")
    if (
        not isinstance(body, str)
        or "\x00" in body
        or len(body.encode("utf-8", "surrogatepass")) > (limits.PEOPLE_BODY_MAX_BYTES)
    ):
        raise _bad(f"body is markdown of up to {limits.PEOPLE_BODY_MAX_BYTES} bytes.", f"{at}.body")
    decisions = value.get("decisions", ["approve", "reject"])
    if (
        not isinstance(decisions, list)
        or not decisions
        or not all(isinstance(d, str) and d in DECISIONS for d in decisions)
    ):
        raise _bad(f"decisions lists some of {', '.join(DECISIONS)}.", f"{at}.decisions")
    decisions = list(dict.fromkeys(decisions))
    schema = value.get("edit_schema")
    if "edit" in decisions:
        schema = edit_schema.check_schema(schema, at=f"{at}.edit_schema")
    elif schema is not None:
        raise _bad('edit_schema goes with the decision "edit".', f"{at}.edit_schema")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict) or _size(arguments) > limits.PEOPLE_ARGUMENTS_MAX_BYTES:
        raise _bad(f"arguments is an object of up to {limits.PEOPLE_ARGUMENTS_MAX_BYTES} bytes.", f"{at}.arguments")
    remind = _seconds(value.get("remind_after_seconds"), f"{at}.remind_after_seconds")
    escalate = _seconds(value.get("escalate_after_seconds"), f"{at}.escalate_after_seconds")
    escalate_to = value.get("escalate_to")
    if escalate_to is not None and not (isinstance(escalate_to, dict) and set(escalate_to) <= {"groups"}):
        raise _bad('escalate_to is {"groups": [names]}.', f"{at}.escalate_to")
    escalate_groups = _names((escalate_to or {}).get("groups"), f"{at}.escalate_to.groups")
    if (escalate is None) != (not escalate_groups):
        raise _bad("escalate_after_seconds and escalate_to.groups go together.", f"{at}.escalate_to")
    return PeopleSpec(
        users=users,
        groups=groups,
        title=title,
        body=body,
        decisions=decisions,
        edit_schema=schema,
        arguments=arguments,
        remind_after=remind,
        escalate_after=escalate,
        escalate_groups=escalate_groups,
    )
