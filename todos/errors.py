"""Errors of the queue. None of them knows HTTP: switchboard/api.py maps ``code`` to a status."""

from __future__ import annotations

from typing import Any

from switchboard.errors import ApplicationError


class QueueError(ApplicationError):
    """A transition (todos/queue/) refused: the base the queue's callers catch."""


class TodoNotFound(QueueError):
    """The todo does not exist, or is outside the caller's scopes (the same answer, so ids do not leak)."""

    code = "not_found"


class QueueNotFound(QueueError):
    """No queue by that name, or it is outside the caller's scopes (the same answer)."""

    code = "not_found"


class LimitNotFound(QueueError):
    """No named limit by that name (issue 31)."""

    code = "not_found"


class TodoConflict(QueueError):
    """The todo exists but the transition's guard failed; ``state`` is its current state."""

    code = "conflict"

    def __init__(self, detail: str, *, state: str, **extra: Any) -> None:
        super().__init__(detail, state=state, **extra)
        self.state = state


class TodoSuperseded(TodoConflict):
    """The todo was superseded (issue 31): a create with ``supersede`` replaced it, cancelling it; its holder's
    next step learns here that it should stop."""

    code = "superseded"


class QueuesForbidden(QueueError):
    """A claim named queues its caller may never claim from. Refused at once, instead of an empty answer
    after the whole long-poll; ``queues`` lists them. Naming them leaks nothing: they come from the caller."""

    code = "forbidden"

    def __init__(self, queues: list[str]) -> None:
        super().__init__(f"Outside this agent's claim scopes: {', '.join(queues)}.", queues=queues)


class InvalidTransitionInput(QueueError):
    """A transition was asked for with values it cannot take (e.g. a queue outside the create scopes)."""

    code = "invalid"

    def __init__(self, detail: str, *, field: str | None = None, **extra: Any) -> None:
        if field:
            extra["fields"] = {field: [detail]}
        super().__init__(detail, **extra)


class PayloadTooLarge(QueueError):
    """A JSON value (a todo's payload, a completion's result) is over MAX_PAYLOAD_BYTES."""

    code = "too_large"


class QueueLimitReached(InvalidTransitionInput):
    """An agent's create would add a queue under a glob create scope that already covers its limit of
    queues (todos/limits.py, max_queues_per_create_scope). ``limit`` and ``scope`` say which."""

    code = "queue_limit"


class BudgetExceeded(QueueError):
    """An agent is over one of its budgets (todos/budgets.py): 429, naming the setting that bounds it, and
    when to try again (``retry_after`` seconds, also the Retry-After header)."""

    code = "throttled"

    def __init__(self, detail: str, *, limit: str, retry_after: int) -> None:
        super().__init__(detail, limit=limit, retry_after=retry_after)


class NotAResolver(QueueError):
    """A resolve by someone the wait does not name: not an operator, not in its ``resolvers``, or the agent
    that waits (issue 28). Answered for a todo the caller can see, so nothing leaks; nothing changes."""

    code = "forbidden"


class WaitpointUsed(QueueError):
    """A waitpoint token resolved already (or whose todo no longer waits). Unlike TodoConflict it carries
    no state: a token holder learns nothing about the todo beyond its own answer (issue 28)."""

    code = "conflict"


class TooManyWaits(QueueError):
    """An agent already holds MAX_OPEN_EVENT_WAITS_PER_AGENT open event waits (429 naming the limit)."""

    code = "throttled"


class ParentNotHeld(QueueError):
    """A create named a parent whose current receipt the caller does not hold: stale (the todo was claimed
    again, or finished), wrong, or another agent's, or outside its scopes. One answer for all of them, with no
    state, so that a guessed parent id learns nothing (issue 30); nothing is created."""

    code = "conflict"


class SpawnLimitReached(QueueError):
    """A create with a parent would pass one of its tree's spawn caps (todos_queue's max_depth, max_children,
    max_descendants of the root's queue, or MAX_TREE_DEPTH): 409 ``spawn_limit`` naming ``limit`` and its
    ``value``; nothing is created."""

    code = "spawn_limit"

    def __init__(self, detail: str, *, limit: str, value: int) -> None:
        super().__init__(detail, limit=limit, value=value)
        self.limit = limit


class AlreadyDecided(QueueError):
    """A person's decision on a wait someone else decided first (issue 29): who and when, so the loser of
    two concurrent clicks sees what happened. Nothing changed."""

    code = "conflict"
