"""What a wait waits for (issue 20), parsed once for every door (REST, MCP), and the keys that let an
ingest transaction find the waits a delivery resolves with index lookups instead of a scan.

A ``for`` is exactly one of:
  {"todos": [ids]}                                       the listed todos all finish
  {"event": {"source", "type" (glob), "match": {...}}}   the first verified event that matches
  {"token": true}                                        POST /api/v1/waitpoints/resolve/ {"token": ...}
  {"people": {"users", "groups", "title", ...}}          a person decides (issue 29, todos/people/spec.py)
An event wait names a source the waiter can see: a route of it reaches the waiter's scopes, the rule of
GET /api/v1/events/ (todos/event_sources.py asks ingest; refused as an unknown source would be).

Who may resolve a wait besides what it waits for (issue 28): an operator (an admin action, or a staff agent
with ``can_retry_dead_letters``, which Django's todos.change_todo gives), and the agents the wait names in
``resolvers`` (agent names, or ``scope:<glob>`` for any agent holding a claim scope the glob matches). Never
the waiting agent itself, and no other agent when the wait names none: the waiter decides who may answer
for it, and a token wait (a person's approval) cannot be answered by the agent it holds back.

Event matching. ``match`` maps dotted paths to scalar values ({"check_suite.head_sha": "abc"}). A wait is
indexed under one key: a hash of (source, its first path, that value), or of (source) alone when it
matches on nothing. A delivery computes the key of each scalar leaf of its payload outside arrays (and
the bare source key), looks those up (todos_waitpoint.event_key), then checks type and the whole match
(payload @> the match as a nested object) on the few rows found.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from rest_framework import serializers

from todos import limits
from todos.api.fields import stored_json_bytes
from todos.errors import InvalidTransitionInput
from todos.limits import MAX_AWAITED, MAX_MATCH_PATHS, MAX_MATCHABLE_LEAVES, WAIT_TIMEOUT_MAX_SECONDS
from todos.models import SCOPE_RE, OnTimeout, glob_to_like
from todos.people import spec as people_spec

SLUG_MAX, TYPE_MAX, PATH_MAX, ID_MAX = 100, 200, 200, 40
AGENT_NAME_RE = re.compile(r"[-a-zA-Z0-9_]{1,100}")  # Agent.name is a SlugField of up to 100
TOKEN_PREFIX = "wpt_"  # noqa: S105 (a prefix, not a secret)
RESOLVER_SCOPE_PREFIX = "scope:"


def _bad(detail: str, name: str) -> InvalidTransitionInput:
    return InvalidTransitionInput(detail, field=name)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _text(value: Any, max_chars: int) -> bool:
    """A string PostgreSQL can bind (no NUL) of 1 to ``max_chars`` characters."""
    return isinstance(value, str) and 1 <= len(value) <= max_chars and "\x00" not in value


@dataclass(frozen=True)
class WaitFor:
    """A parsed ``for``: ``shown`` is what the todo's JSON shows (waiting_for), never a token."""

    kind: str  # "todos" | "event" | "token" | "people"
    shown: dict[str, Any]
    todo_ids: list[str] = field(default_factory=list)
    source: str | None = None
    type_like: str | None = None
    match: dict[str, Any] | None = None  # nested, for containment
    key: str | None = None
    people: people_spec.PeopleSpec | None = None  # for {"people": ...} (todos/people/spec.py)


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
    if not isinstance(source, str) or not _text(source, SLUG_MAX):
        raise _bad("source must be the slug of an ingest source.", "for.event.source")
    if not isinstance(type_glob, str) or not _text(type_glob, TYPE_MAX):
        raise _bad("type must be an event type or a glob of * and ?, e.g. check_suite.*.", "for.event.type")
    if not isinstance(match, dict) or len(match) > MAX_MATCH_PATHS:
        raise _bad(f"match must map up to {MAX_MATCH_PATHS} dotted paths to values.", "for.event.match")
    for path, value in match.items():
        if not _text(path, PATH_MAX) or "" in path.split("."):
            raise _bad(f"{path!r} is not a dotted path such as check_suite.head_sha.", "for.event.match")
        if not _scalar(value):
            raise _bad(f"{path!r}: match values are strings, numbers, booleans or null.", "for.event.match")
        if isinstance(value, str) and (len(value) > limits.WAIT_MATCH_VALUE_MAX_CHARS or "\x00" in value):
            raise _bad(
                f"{path!r}: a match value is at most {limits.WAIT_MATCH_VALUE_MAX_CHARS} characters, without NUL.",
                "for.event.match",
            )
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
        raise _bad(
            'for must be exactly one of {"todos": [ids]}, {"event": {...}}, {"token": true}, {"people": {...}}.',
            "for",
        )
    ((kind, value),) = spec.items()
    if kind == "people":
        # Bigger (a question's body, arguments and schema), and only its short part reaches errors. Stored
        # as given (jsonb): no NUL, no lone surrogate, no NaN, bounded nesting (the payload's rule).
        try:
            size = stored_json_bytes(spec)
        except serializers.ValidationError as exc:
            why = str(exc.detail[0]) if isinstance(exc.detail, list) else "not storable JSON"
            raise _bad(why, "for.people") from None
        if size > limits.PEOPLE_WAIT_MAX_BYTES:
            raise _bad(f"people is at most {limits.PEOPLE_WAIT_MAX_BYTES} bytes as JSON.", "for.people")
        asked = people_spec.parse(value)
        return WaitFor(kind="people", shown=asked.shown(), people=asked)
    if _json_bytes(spec) > limits.WAIT_FOR_MAX_BYTES:
        raise _bad(f"for is at most {limits.WAIT_FOR_MAX_BYTES} bytes as JSON.", "for")
    if kind == "token":
        if value is not True:
            raise _bad("token must be true.", "for.token")
        return WaitFor(kind="token", shown={"token": True})
    if kind == "event":
        return _parse_event(value)
    if kind == "todos":
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_AWAITED:
            raise _bad(f"todos must list 1 to {MAX_AWAITED} todo ids.", "for.todos")
        # NUL cannot reach SQL (400); an id of another shape is answered as an unseen one (404 naming it).
        if not all(_text(i, ID_MAX) for i in value):
            raise _bad("todos must list todo ids.", "for.todos")
        awaited = list(dict.fromkeys(value))
        if waiter_id in awaited:
            raise _bad("A todo cannot wait for itself.", "for.todos")
        return WaitFor(kind="todos", shown={"todos": awaited}, todo_ids=awaited)
    raise _bad(f"Unknown kind {kind[:60]!r}; expected todos, event, token or people.", f"for.{kind[:60]}")


def _json_bytes(value: Any) -> int:
    try:
        return len(
            json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
                "utf-8", "surrogatepass"
            )
        )
    except (TypeError, ValueError, RecursionError):
        raise _bad("for must be plain JSON.", "for") from None


@dataclass(frozen=True)
class Resolvers:
    """Who besides the token holder and operators may resolve a wait: exact agent names, and LIKE patterns
    (glob_to_like) matched against a resolving agent's claim scopes as written. Never a regex."""

    agents: list[str] = field(default_factory=list)
    scope_likes: list[str] = field(default_factory=list)


def parse_resolvers(value: Any) -> Resolvers:
    """``resolvers`` of a wait, checked: agent names and ``scope:<glob>`` entries, at most
    WAIT_RESOLVERS_MAX; InvalidTransitionInput names the field at fault."""
    if value is None:
        return Resolvers()
    if not isinstance(value, list) or len(value) > limits.WAIT_RESOLVERS_MAX:
        raise _bad(
            f"resolvers must list up to {limits.WAIT_RESOLVERS_MAX} agent names or scope:<glob> entries.", "resolvers"
        )
    resolvers = Resolvers()
    for entry in value:
        if isinstance(entry, str) and entry.startswith(RESOLVER_SCOPE_PREFIX):
            glob = entry[len(RESOLVER_SCOPE_PREFIX) :]
            wildcards = glob.count("*") + glob.count("?")
            if not SCOPE_RE.match(glob) or wildcards > limits.WAIT_RESOLVER_WILDCARDS_MAX:
                raise _bad(
                    f"{entry[:60]!r}: scope:<glob> takes a claim scope or a glob of * and ? (at most "
                    f"{limits.WAIT_RESOLVER_WILDCARDS_MAX} wildcards).",
                    "resolvers",
                )
            resolvers.scope_likes.append(glob_to_like(glob))
        elif isinstance(entry, str) and AGENT_NAME_RE.fullmatch(entry):
            resolvers.agents.append(entry)
        else:
            raise _bad(f"{str(entry)[:60]!r} is neither an agent name nor scope:<glob>.", "resolvers")
    return resolvers


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
