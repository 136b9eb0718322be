"""What a wait waits for (issue 20), parsed once for every door (REST, MCP), and the keys that let an
ingest transaction find the waits a delivery resolves with index lookups instead of a scan.

A ``for`` is exactly one of:
  {"todos": [ids]}                                       the listed todos all finish
  {"event": {"source", "type" (glob), "match": {...}}}   the first verified event that matches
  {"token": true}                                        POST /api/v1/waitpoints/<token>/resolve/
Any wait may also be resolved by an agent whose scopes cover the queue, or by an operator.

Event matching. ``match`` maps dotted paths to scalar values ({"check_suite.head_sha": "abc"}). A wait is
indexed under one key: a hash of (source, its first path, that value), or of (source) alone when it
matches on nothing. A delivery computes the key of each scalar leaf of its payload outside arrays (and
the bare source key), looks those up (todos_waitpoint.event_key), then checks type and the whole match
(payload @> the match as a nested object) on the few rows found.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from todos.errors import InvalidTransitionInput
from todos.limits import MAX_AWAITED, MAX_MATCH_PATHS, MAX_MATCHABLE_LEAVES, WAIT_TIMEOUT_MAX_SECONDS
from todos.models import OnTimeout, glob_to_like

SLUG_MAX, TYPE_MAX, PATH_MAX = 100, 200, 200
TOKEN_PREFIX = "wpt_"  # noqa: S105 (a prefix, not a secret)


def _bad(detail: str, name: str) -> InvalidTransitionInput:
    return InvalidTransitionInput(detail, field=name)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


@dataclass(frozen=True)
class WaitFor:
    """A parsed ``for``: ``shown`` is what the todo's JSON shows (waiting_for), never a token."""

    kind: str  # "todos" | "event" | "token"
    shown: dict[str, Any]
    todo_ids: list[str] = field(default_factory=list)
    source: str | None = None
    type_like: str | None = None
    match: dict[str, Any] | None = None  # nested, for containment
    key: str | None = None


def event_key(source: str, path: str = "", value: Any = None) -> str:
    text = f"{source}\x1f{path}\x1f{json.dumps(value, sort_keys=True)}" if path else f"{source}\x1f"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def delivery_keys(source: str, payload: Any) -> list[str]:
    """Every key a wait on this delivery could be indexed under (breadth first, at most MAX_MATCHABLE_LEAVES)."""
    keys = [event_key(source)]
    queue: list[tuple[str, Any]] = [("", payload)]
    while queue and len(keys) <= MAX_MATCHABLE_LEAVES:
        prefix, node = queue.pop(0)
        if not isinstance(node, dict):
            continue
        for name, value in node.items():
            path = f"{prefix}.{name}" if prefix else str(name)
            if isinstance(value, dict):
                queue.append((path, value))
            elif _scalar(value):
                keys.append(event_key(source, path, value))
    return keys


def _nested(match: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in match.items():
        node = nested
        *parents, last = path.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise _bad(f"{path!r} crosses another path's value.", "for.event.match")
            node = child
        if last in node:
            raise _bad(f"{path!r} overlaps another path.", "for.event.match")
        node[last] = value
    return nested


def _parse_event(spec: Any) -> WaitFor:
    if not isinstance(spec, dict):
        raise _bad("event must be an object with source, type and match.", "for.event")
    unknown = sorted(set(spec) - {"source", "type", "match"})
    if unknown:
        raise _bad(f"Unknown field {unknown[0]!r}; expected source, type, match.", f"for.event.{unknown[0]}")
    source, type_glob, match = spec.get("source"), spec.get("type", "*"), spec.get("match", {})
    if not isinstance(source, str) or not 1 <= len(source) <= SLUG_MAX:
        raise _bad("source must be the slug of an ingest source.", "for.event.source")
    if not isinstance(type_glob, str) or not 1 <= len(type_glob) <= TYPE_MAX:
        raise _bad("type must be an event type or a glob of * and ?, e.g. check_suite.*.", "for.event.type")
    if not isinstance(match, dict) or len(match) > MAX_MATCH_PATHS:
        raise _bad(f"match must map up to {MAX_MATCH_PATHS} dotted paths to values.", "for.event.match")
    for path, value in match.items():
        if not path or len(path) > PATH_MAX or "" in path.split("."):
            raise _bad(f"{path!r} is not a dotted path such as check_suite.head_sha.", "for.event.match")
        if not _scalar(value):
            raise _bad(f"{path!r}: match values are strings, numbers, booleans or null.", "for.event.match")
    first = sorted(match)[0] if match else ""
    return WaitFor(
        kind="event",
        shown={"event": {"source": source, "type": type_glob, "match": match}},
        source=source,
        type_like=glob_to_like(type_glob),
        match=_nested(match),
        key=event_key(source, first, match[first]) if match else event_key(source),
    )


def parse_for(spec: Any, *, waiter_id: str) -> WaitFor:
    """The ``for`` of a wait, checked: InvalidTransitionInput names the field at fault."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise _bad('for must be exactly one of {"todos": [ids]}, {"event": {...}}, {"token": true}.', "for")
    ((kind, value),) = spec.items()
    if kind == "token":
        if value is not True:
            raise _bad("token must be true.", "for.token")
        return WaitFor(kind="token", shown={"token": True})
    if kind == "event":
        return _parse_event(value)
    if kind == "todos":
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_AWAITED:
            raise _bad(f"todos must list 1 to {MAX_AWAITED} todo ids.", "for.todos")
        if not all(isinstance(i, str) and 0 < len(i) <= 40 for i in value):
            raise _bad("todos must list todo ids.", "for.todos")
        ids = list(dict.fromkeys(value))
        if waiter_id in ids:
            raise _bad("A todo cannot wait for itself.", "for.todos")
        return WaitFor(kind="todos", shown={"todos": ids}, todo_ids=ids)
    raise _bad(f"Unknown kind {kind!r}; expected todos, event or token.", f"for.{kind}")


def check_timeout(timeout_seconds: Any, on_timeout: Any) -> tuple[float, str]:
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int | float):
        raise _bad("timeout_seconds is required: a number of seconds up to 30 days.", "timeout_seconds")
    if not 1 <= timeout_seconds <= WAIT_TIMEOUT_MAX_SECONDS:
        raise _bad(f"timeout_seconds must be between 1 and {WAIT_TIMEOUT_MAX_SECONDS} (30 days).", "timeout_seconds")
    if on_timeout not in OnTimeout.values:
        raise _bad("on_timeout must be 'pending' (default) or 'fail'.", "on_timeout")
    return float(timeout_seconds), str(on_timeout)


def new_token() -> str:
    """A waitpoint token: 192 random bits; only its hash (models.hash_token) is stored."""
    return TOKEN_PREFIX + secrets.token_urlsafe(24)
