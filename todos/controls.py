"""Queue controls: pause, resume, and the concurrency and rate limits (issue 11).

They live on the queue's row in todos_queue, which every claim statement reads (todos/sql/claim.py,
CLAIM_NEXT): a change is durable and holds for every process from its next claim. This module writes
that row; the claim enforces it. Each function is one statement; an unknown queue, or one outside the
caller's scopes, is not found.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from todos import sql
from todos.errors import InvalidTransitionInput, QueueNotFound
from todos.flow import limit_names_problem
from todos.limits import MAX_FAIR_KEY_CHARS, MAX_FAIR_WEIGHTS_KEYS, MAX_QUEUE_LIMIT
from todos.models import QUEUE_NAME_RE, SYSTEM_QUEUES, Agent, visible_patterns
from todos.rows import fetchall

# NUL and lone surrogates: jsonb refuses the one, UTF-8 cannot encode the other (a 500 either way).
_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


# "Leave this control as it is": a PATCH that does not name it.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class QueueControls:
    name: str
    paused: bool
    max_claimed: int | None
    rate_per_second: float | None
    rate_burst: int | None
    fair: bool = False
    fair_weights: dict[str, float] = field(default_factory=dict)
    max_claimed_per_key: int | None = None
    # Spawn caps of the trees rooted in this queue (issue 30; todos/sql/create.py, SPAWN).
    max_depth: int | None = None
    max_children: int | None = None
    max_descendants: int | None = None
    # Named limits (issue 31) every todo of the queue is held by (todos/flow.py); None: none.
    limits: list[str] | None = None
    # Issue 31: claims a second per fair_key, times the key's weight (a keyed queue's); None: no per-key rate.
    rate_per_key: float | None = None


def describe_limits(queue: Any) -> str:
    """A queue's limits in a few words, e.g. "max 3 claimed · 20/s burst 5" ("" for none): the dashboard
    and the admin's queue page. ``queue``: anything with the three control attributes."""
    parts = []
    if queue.max_claimed is not None:
        parts.append(f"max {queue.max_claimed} claimed")
    if queue.rate_per_second is not None:
        parts.append(f"{queue.rate_per_second:g}/s burst {queue.rate_burst}")
    if getattr(queue, "fair", False):
        parts.append("fair")
    if getattr(queue, "max_claimed_per_key", None) is not None:
        parts.append(f"max {queue.max_claimed_per_key} per key")
    if getattr(queue, "rate_per_key", None) is not None:
        parts.append(f"{queue.rate_per_key:g}/s per key")
    if getattr(queue, "limits", None):
        parts.append("limits " + ", ".join(queue.limits))
    return " · ".join(parts)


def _one(statement: str, name: str, agent: Agent | None, **params: Any) -> QueueControls:
    # A name no queue can have (a NUL byte from the URL, which PostgreSQL's text refuses) is not found
    # without a query, as an id of the wrong shape is.
    rows = (
        fetchall(statement, {"name": name, "visible": visible_patterns(agent), **params}) if _queue_name(name) else []
    )
    if not rows:
        # 404, as for any missing resource in the URL (a 400 would blame the body); its JSON names the queue
        # as a 400 names a field, so a client tells "no such queue" from a bad value the same way.
        detail = f"No queue {name!r}."
        raise QueueNotFound(detail, fields={"queue": [detail]})
    row = list(rows[0])
    if isinstance(row[6], str):  # Django's cursor hands jsonb over as text (its JSONField decodes it)
        row[6] = json.loads(row[6])
    return QueueControls(*row)


def _queue_name(name: str) -> bool:
    # The system's queues too (an operator pauses _switchboard.notify); agents' scopes never reach them.
    return QUEUE_NAME_RE.fullmatch(name) is not None or name in SYSTEM_QUEUES


def get(name: str, *, agent: Agent | None = None) -> QueueControls:
    return _one(sql.QUEUE_CONTROLS, name, agent)


def pause(name: str, *, agent: Agent | None = None) -> QueueControls:
    """Claims hand out nothing from the queue from their next statement on; creates still land, and
    leases already held run on."""
    return _one(sql.PAUSE_QUEUE, name, agent)


def resume(name: str, *, agent: Agent | None = None) -> QueueControls:
    """Claims take from the queue again; its waiting long-polls are woken."""
    return _one(sql.RESUME_QUEUE, name, agent)


def _check_count(field: str, value: Any, minimum: int) -> None:
    if value is UNSET or value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_QUEUE_LIMIT:
        raise InvalidTransitionInput(
            f"{field} must be a whole number from {minimum} to {MAX_QUEUE_LIMIT}, or null.", field=field
        )


def _check_weights(weights: Any) -> None:
    """fair_weights: an object of at most MAX_FAIR_WEIGHTS_KEYS keys (the todos' fair_keys: at most
    MAX_FAIR_KEY_CHARS characters, no NUL nor lone surrogate, which jsonb and UTF-8 cannot store) to a
    weight above 0 and at most MAX_QUEUE_LIMIT."""
    if weights is UNSET or weights is None:  # None: every key weighs 1 again
        return
    if not isinstance(weights, dict):
        raise InvalidTransitionInput("fair_weights must be an object from key to weight.", field="fair_weights")
    if len(weights) > MAX_FAIR_WEIGHTS_KEYS:
        raise InvalidTransitionInput(
            f"fair_weights holds at most {MAX_FAIR_WEIGHTS_KEYS} keys (others weigh 1).",
            field="fair_weights",
            limit=MAX_FAIR_WEIGHTS_KEYS,
        )
    for key, weight in weights.items():
        if not isinstance(key, str) or len(key) > MAX_FAIR_KEY_CHARS or _UNSTORABLE_CHAR.search(key):
            raise InvalidTransitionInput(
                f"fair_weights' keys are fair_keys: text of at most {MAX_FAIR_KEY_CHARS} characters, without NUL.",
                field="fair_weights",
            )
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
            or not 0 < weight <= MAX_QUEUE_LIMIT
        ):
            raise InvalidTransitionInput(
                f"fair_weights[{key!r}] must be a number above 0 and at most {MAX_QUEUE_LIMIT}.", field="fair_weights"
            )


def check_limits(
    *,
    max_claimed: Any = UNSET,
    rate_per_second: Any = UNSET,
    rate_burst: Any = UNSET,
    fair: Any = UNSET,
    fair_weights: Any = UNSET,
    max_claimed_per_key: Any = UNSET,
    max_depth: Any = UNSET,
    max_children: Any = UNSET,
    max_descendants: Any = UNSET,
    limits: Any = UNSET,
    rate_per_key: Any = UNSET,
) -> None:
    """Raise InvalidTransitionInput naming the first bad value (the API's serializer and the admin's form
    check the same bounds first; this guards every caller)."""
    _check_count("max_claimed", max_claimed, 0)
    _check_count("max_claimed_per_key", max_claimed_per_key, 1)
    _check_count("max_depth", max_depth, 0)
    _check_count("max_children", max_children, 0)
    _check_count("max_descendants", max_descendants, 0)
    if fair is not UNSET and not isinstance(fair, bool):
        raise InvalidTransitionInput("fair must be true or false.", field="fair")
    _check_weights(fair_weights)
    if limits is not UNSET and (problem := limit_names_problem(limits)) is not None:
        raise InvalidTransitionInput(problem, field="limits")
    _check_count("rate_burst", rate_burst, 1)
    if (
        rate_per_key is not UNSET
        and rate_per_key is not None
        and (
            isinstance(rate_per_key, bool)
            or not isinstance(rate_per_key, int | float)
            or not math.isfinite(rate_per_key)
            or not 0 < rate_per_key <= MAX_QUEUE_LIMIT
        )
    ):
        raise InvalidTransitionInput(
            f"rate_per_key must be a number above 0 and at most {MAX_QUEUE_LIMIT}, or null.", field="rate_per_key"
        )
    if rate_per_second is not UNSET and rate_per_second is not None:
        if (
            isinstance(rate_per_second, bool)
            or not isinstance(rate_per_second, int | float)
            or not math.isfinite(rate_per_second)
            or not 0 < rate_per_second <= MAX_QUEUE_LIMIT
        ):
            raise InvalidTransitionInput(
                f"rate_per_second must be a number above 0 and at most {MAX_QUEUE_LIMIT}, or null.",
                field="rate_per_second",
            )


def set_limits(
    name: str,
    *,
    max_claimed: int | None = UNSET,
    rate_per_second: float | None = UNSET,
    rate_burst: int | None = UNSET,
    fair: bool = UNSET,
    fair_weights: dict[str, float] = UNSET,
    max_claimed_per_key: int | None = UNSET,
    max_depth: int | None = UNSET,
    max_children: int | None = UNSET,
    max_descendants: int | None = UNSET,
    limits: list[str] | None = UNSET,
    rate_per_key: float | None = UNSET,
    agent: Agent | None = None,
) -> QueueControls:
    """Set the controls given (None removes one; UNSET leaves it). ``max_claimed``: live leases at once.
        ``rate_per_second`` and ``rate_burst``: a token bucket, which starts full whenever either is set; the
        burst defaults to one second's worth (at least 1). ``fair``, ``fair_weights`` and
        ``max_claimed_per_key``: fair share among the todos' fair_keys (todos/sql/claim.py, CLAIM_NEXT). Effective
        from the next claim. ``max_depth``, ``max_children`` and ``max_descendants``: the spawn caps of the trees
        whose root is in this queue, effective from the next create with a parent. ``limits``: named limits
    (issue 31, todos/flow.py) every todo of the queue is held by, effective from the next claim."""
    check_limits(
        max_claimed=max_claimed,
        rate_per_second=rate_per_second,
        rate_burst=rate_burst,
        fair=fair,
        fair_weights=fair_weights,
        max_claimed_per_key=max_claimed_per_key,
        max_depth=max_depth,
        max_children=max_children,
        max_descendants=max_descendants,
        limits=limits,
        rate_per_key=rate_per_key,
    )
    spawn_caps = {"max_depth": max_depth, "max_children": max_children, "max_descendants": max_descendants}
    if rate_burst is not UNSET and rate_burst is not None:
        rate = get(name, agent=agent).rate_per_second if rate_per_second is UNSET else rate_per_second
        if rate is None:
            raise InvalidTransitionInput("rate_burst needs a rate_per_second.", field="rate_burst")
    # One short transaction: the update, then the reservations of a queue no longer reservable (issue 31), in a
    # statement of its own (todos/sql/queue_controls.py, FORGET_RESERVATIONS: its snapshot follows the wait).
    with transaction.atomic():
        controls = _one(
            sql.SET_QUEUE_LIMITS,
            name,
            agent,
            set_max_claimed=max_claimed is not UNSET,
            max_claimed=None if max_claimed is UNSET else max_claimed,
            set_rate=rate_per_second is not UNSET,
            rate_per_second=None if rate_per_second is UNSET else rate_per_second,
            set_burst=rate_burst is not UNSET,
            rate_burst=None if rate_burst is UNSET else rate_burst,
            set_fair=fair is not UNSET,
            fair=None if fair is UNSET else fair,
            set_fair_weights=fair_weights is not UNSET,
            fair_weights=Jsonb({} if fair_weights is UNSET or fair_weights is None else fair_weights),
            set_max_claimed_per_key=max_claimed_per_key is not UNSET,
            max_claimed_per_key=None if max_claimed_per_key is UNSET else max_claimed_per_key,
            set_rate_per_key=rate_per_key is not UNSET,
            rate_per_key=None if rate_per_key is UNSET else rate_per_key,
            set_limits=limits is not UNSET,
            limits=sorted(set(limits)) if limits not in (UNSET, None) else [],
            **{
                **{f"set_{cap}": value is not UNSET for cap, value in spawn_caps.items()},
                **{cap: None if value is UNSET else value for cap, value in spawn_caps.items()},
            },
        )
        with connection.cursor() as cursor:
            cursor.execute(sql.FORGET_RESERVATIONS, {"name": controls.name})
    return controls
