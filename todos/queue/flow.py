"""Parking on a quota wall (issue 31): the holder of a todo gives it back and parks a named limit its todo
names until the wall resets (todos/sql/flow.py, PARK). No attempt is spent."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from todos import sql, tracing
from todos.errors import InvalidTransitionInput
from todos.limits import MAX_PARK_REASON_CHARS, MAX_PARK_SECONDS
from todos.metrics import counted
from todos.models import Agent, Todo, visible_patterns
from todos.queue._common import miss
from todos.queue.lease import with_receipt
from todos.rows import fetchall


def check_park(limit: object, until: object, reason: object) -> None:
    """Raise InvalidTransitionInput (field ``park``) unless this is a park: a limit's name, a time with an
    offset in the future and at most MAX_PARK_SECONDS ahead, a reason of at most MAX_PARK_REASON_CHARS."""
    from todos.flow import limit_name_ok

    if not limit_name_ok(limit):
        raise InvalidTransitionInput("park.limit must be a limit's name.", field="park")
    now = timezone.now()
    if (
        not isinstance(until, datetime)
        or until.tzinfo is None
        or not now < until <= now + timedelta(seconds=MAX_PARK_SECONDS)
    ):
        raise InvalidTransitionInput(
            f"park.until must be a time (with an offset) in the future, at most {MAX_PARK_SECONDS} s ahead.",
            field="park",
        )
    if not isinstance(reason, str) or len(reason) > MAX_PARK_REASON_CHARS or "\x00" in reason:
        raise InvalidTransitionInput(
            f"park.reason is text of at most {MAX_PARK_REASON_CHARS} characters.", field="park"
        )


@counted("park")
@tracing.traced("park")
def park(
    todo_id: str, *, agent: Agent, lease_id: str, limit: str, until: datetime, reason: str = "", error: str = ""
) -> Todo:
    """claimed -> pending, giving the attempt back, and the limit ``limit`` parked until ``until``: claims take
    none of the todos it holds (in any queue) until then, or until an operator lifts it. The todo must name the
    limit (its own limits or its queue's): else a 400 naming ``park``, and nothing changes. Needs the current
    receipt."""
    check_park(limit, until, reason)
    rows = fetchall(sql.HELD_LIMITS, {"id": todo_id, "visible": visible_patterns(agent)})
    if not rows:
        raise miss(todo_id, agent, "park")
    if limit not in (rows[0][0] or []):
        raise InvalidTransitionInput(f"This todo is not held by the limit {limit!r}: it cannot park it.", field="park")
    return with_receipt(
        sql.PARK, "park", todo_id, agent, lease_id, limit=limit, until=until, reason=reason, error=error or None
    )
