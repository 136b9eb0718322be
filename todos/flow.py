"""Named limits (issue 31): a limit shared by every queue and todo that names it (``limits: ["openai"]``),
with max_claimed, a token bucket (rate_per_second, rate_burst) and per_key (live leases per fair_key, times
the key's weight). This module writes the limit rows (one statement each); the claim statements enforce them
(todos/sql/flow.py). Setting a limit takes a ``--can-manage`` agent or staff (the views check).

A limit's name is data: 1-100 characters of a queue name's alphabet, never a pattern; a todo or a queue names
at most MAX_LIMITS_NAMED of them. A name no PUT defined limits nothing until it is defined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from todos import sql
from todos.errors import InvalidTransitionInput, LimitNotFound
from todos.limits import MAX_LIMITS_NAMED, MAX_QUEUE_LIMIT
from todos.models import LIMIT_NAME_RE
from todos.rows import fetchall


@dataclass(frozen=True)
class NamedLimit:
    name: str
    max_claimed: int | None
    rate_per_second: float | None
    rate_burst: int | None
    per_key: int | None
    parked_until: datetime | None
    park_reason: str
    created_at: datetime
    updated_at: datetime

    def as_json(self) -> dict[str, Any]:
        until = self.parked_until if self.parked_until is not None and self.parked_until > _now() else None
        return {
            "name": self.name,
            "max_claimed": self.max_claimed,
            "rate_per_second": self.rate_per_second,
            "rate_burst": self.rate_burst,
            "per_key": self.per_key,
            "parked": {"until": until.isoformat(), "reason": self.park_reason} if until is not None else None,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def limit_name_ok(name: Any) -> bool:
    return isinstance(name, str) and LIMIT_NAME_RE.fullmatch(name) is not None


def limit_names_problem(names: Any) -> str | None:
    """Why ``limits`` (a create's, a queue's, a route's or a schedule's) is not a list of limit names, or None."""
    if names is None:
        return None
    if not isinstance(names, list | tuple) or not all(limit_name_ok(n) for n in names):
        return (
            "limits must be a list of limit names (1-100 characters of letters, digits and . _ : / -, "
            "starting with a letter or digit)."
        )
    if len(set(names)) > MAX_LIMITS_NAMED:
        return f"limits names at most {MAX_LIMITS_NAMED} limits."
    return None


def _check_count(field: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_QUEUE_LIMIT:
        raise InvalidTransitionInput(
            f"{field} must be a whole number from {minimum} to {MAX_QUEUE_LIMIT}, or null.", field=field
        )


def check(*, max_claimed: Any = None, rate_per_second: Any = None, rate_burst: Any = None, per_key: Any = None) -> None:
    """Raise InvalidTransitionInput naming the first bad value."""
    _check_count("max_claimed", max_claimed, 0)
    _check_count("per_key", per_key, 1)
    _check_count("rate_burst", rate_burst, 1)
    if rate_per_second is not None and (
        isinstance(rate_per_second, bool)
        or not isinstance(rate_per_second, int | float)
        or not math.isfinite(rate_per_second)
        or not 0 < rate_per_second <= MAX_QUEUE_LIMIT
    ):
        raise InvalidTransitionInput(
            f"rate_per_second must be a number above 0 and at most {MAX_QUEUE_LIMIT}, or null.",
            field="rate_per_second",
        )
    if rate_burst is not None and rate_per_second is None:
        raise InvalidTransitionInput("rate_burst needs a rate_per_second.", field="rate_burst")


def _one(rows: list[tuple[Any, ...]], name: str) -> NamedLimit:
    if not rows:
        detail = f"No limit {name!r}."
        raise LimitNotFound(detail, fields={"limit": [detail]})
    return NamedLimit(*rows[0])


def _name(name: str) -> str:
    if not limit_name_ok(name):
        detail = f"No limit {name!r}."
        raise LimitNotFound(detail, fields={"limit": [detail]})
    return name


def get(name: str) -> NamedLimit:
    return _one(fetchall(sql.GET_LIMIT, {"name": _name(name)}), name)


def put(
    name: str,
    *,
    max_claimed: int | None = None,
    rate_per_second: float | None = None,
    rate_burst: int | None = None,
    per_key: int | None = None,
) -> tuple[NamedLimit, bool]:
    """Define the limit (or replace its settings; a park stays): every queue and todo naming it is held by it
    from the next claim. The bucket starts full (the burst defaults to one second's worth, at least 1).
    Returns the limit and whether it was created."""
    if not limit_name_ok(name):
        raise InvalidTransitionInput(
            "A limit's name is 1-100 characters of letters, digits and . _ : / -, starting with a letter or digit.",
            field="name",
        )
    check(max_claimed=max_claimed, rate_per_second=rate_per_second, rate_burst=rate_burst, per_key=per_key)
    burst = rate_burst if rate_burst is not None else (max(1, math.ceil(rate_per_second)) if rate_per_second else None)
    rows = fetchall(
        sql.PUT_LIMIT,
        {
            "name": name,
            "max_claimed": max_claimed,
            "rate_per_second": rate_per_second,
            "rate_burst": burst,
            "per_key": per_key,
        },
    )
    *limit, created = rows[0]
    return NamedLimit(*limit), bool(created)


def unpark(name: str) -> NamedLimit:
    """An operator lifts a park: the limit's todos are claimable again from the next claim."""
    return _one(fetchall(sql.UNPARK, {"name": _name(name)}), name)


def delete(name: str) -> NamedLimit:
    """Remove the limit: its names then limit nothing (todos and queues keep naming it). Returns it as it was."""
    return _one(fetchall(sql.DELETE_LIMIT, {"name": _name(name)}), name)
