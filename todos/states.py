"""The queue's vocabulary: each stored state and each state derived from a todo's columns, defined once.

Every condition comes in the three forms the code needs, built from the same pieces so that they cannot
drift apart (todos/tests/test_states.py checks them against a table holding every shape):

* ``sql(alias)``  a WHERE fragment for the hand-written statements of todos/sql/ (``alias`` prefixes
                  each column, e.g. ``sql("t")``); times compare with the database's now() (SPEC
                  decision 7)
* ``q``           a Django ``Q`` for the ORM, the admin's filters, and the partial indexes and
                  constraints of todos/models.py
* ``holds(todo)`` a predicate on a ``Todo`` instance (``now`` defaults to the application's clock)

Adding a state: a ``TodoState`` member, its condition below, its entry in ``SHAPES`` (the CHECK
constraint todos/models.py builds from it), and a migration; a derived state is one more condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone


class TodoState(models.TextChoices):
    # What each state means and holds. Which transitions enter and leave it is written once, in
    # docs/architecture.md's state table (switchboard/tests/test_architecture.py checks that table names
    # exactly these states and only functions of todos/queue), so it is not restated here.
    PENDING = "pending", "pending"  # runnable now; holds no lease (after a lapse it keeps the old receipt)
    CLAIMED = "claimed", "claimed"  # leased: always owner, lease_id and lease_expires_at
    DONE = "done", "done"  # terminal; completed_at set, no lease
    FAILED = "failed", "failed"  # retry-waiting with next_retry_at, a dead-letter without
    SCHEDULED = "scheduled", "scheduled"  # runnable once run_at has passed; holds no lease
    CANCELLED = "cancelled", "cancelled"  # terminal; completed_at is when, errors say who and why
    WAITING = "waiting", "waiting"  # never claimed until resolved; waiting_for says what it waits for


class Todo(Protocol):
    """The columns the predicates read: a todos.models.Todo (not imported: models.py builds its indexes
    and constraints from this module)."""

    @property
    def state(self) -> str: ...
    @property
    def next_retry_at(self) -> datetime | None: ...
    @property
    def lease_expires_at(self) -> datetime | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def run_at(self) -> datetime | None: ...
    @property
    def waiting_for(self) -> Any: ...


Predicate = Callable[[Todo, datetime], bool]


@dataclass(frozen=True)
class Condition:
    """One condition on a todo's columns, in SQL, as a Q, and as a predicate."""

    template: str  # SQL with ``{t}`` where the table alias (and its dot) goes
    q: Q
    test: Predicate
    label: str = ""
    states: tuple[str, ...] = ()  # set for a plain test of the state column: lets ``|`` make one IN

    def sql(self, alias: str = "") -> str:
        return self.template.format(t=f"{alias}." if alias else "")

    def holds(self, todo: Todo, now: datetime | None = None) -> bool:
        return self.test(todo, now or timezone.now())

    def named(self, label: str) -> Condition:
        return Condition(self.template, self.q, self.test, label, self.states)

    def __and__(self, other: Condition) -> Condition:
        a, b = self.test, other.test
        return Condition(
            f"{self.template} AND {other.template}", _and(self.q, other.q), lambda t, n: a(t, n) and b(t, n)
        )

    def __or__(self, other: Condition) -> Condition:
        if self.states and other.states:
            return state_in(*self.states, *other.states)
        a, b = self.test, other.test
        # Parenthesised, so that a disjunction composes safely under a later AND.
        return Condition(f"({_term(self)} OR {_term(other)})", self.q | other.q, lambda t, n: a(t, n) or b(t, n))


def _term(c: Condition) -> str:
    return c.template if c.states or c.template.startswith("(") else f"({c.template})"


def _and(a: Q, b: Q) -> Q:
    # Two plain conjunctions merge into one Q(**kwargs), whose children Django sorts: the same Q that
    # the partial indexes of migrations 0001-0007 were written with, so no index is rebuilt.
    if _plain(a) and _plain(b):
        return Q(**dict(a.children), **dict(b.children))  # type: ignore[arg-type]
    return a & b


def _plain(q: Q) -> bool:
    return q.connector == Q.AND and not q.negated and all(isinstance(c, tuple) for c in q.children)


def state_in(*states: str) -> Condition:
    """The state column is one of ``states``: the guard of a transition that several states may take."""
    values = tuple(dict.fromkeys(str(s) for s in states))
    if len(values) == 1:
        return Condition(
            f"{{t}}state = '{values[0]}'", Q(state=values[0]), lambda t, _: t.state == values[0], "", values
        )
    listed = ", ".join(f"'{v}'" for v in values)
    return Condition(f"{{t}}state IN ({listed})", Q(state__in=list(values)), lambda t, _: t.state in values, "", values)


# --- Stored states -------------------------------------------------------------------------------

PENDING = state_in(TodoState.PENDING).named("pending")
CLAIMED = state_in(TodoState.CLAIMED).named("claimed")
DONE = state_in(TodoState.DONE).named("done")
FAILED = state_in(TodoState.FAILED).named("failed")
SCHEDULED = state_in(TodoState.SCHEDULED).named("scheduled")
CANCELLED = state_in(TodoState.CANCELLED).named("cancelled")
WAITING = state_in(TodoState.WAITING).named("waiting")

# --- The column tests the derived states are made of -----------------------------------------------

RETRY_SCHEDULED = Condition(
    "{t}next_retry_at IS NOT NULL", Q(next_retry_at__isnull=False), lambda t, _: t.next_retry_at is not None
)
NO_RETRY = Condition("{t}next_retry_at IS NULL", Q(next_retry_at__isnull=True), lambda t, _: t.next_retry_at is None)
RETRY_TIME_REACHED = Condition(
    "{t}next_retry_at <= now()",
    Q(next_retry_at__lte=Now()),
    lambda t, now: t.next_retry_at is not None and t.next_retry_at <= now,
)
LEASE_UNEXPIRED = Condition(
    "{t}lease_expires_at >= now()",
    Q(lease_expires_at__gte=Now()),
    lambda t, now: t.lease_expires_at is not None and t.lease_expires_at >= now,
)
LEASE_EXPIRED = Condition(
    "{t}lease_expires_at < now()",
    Q(lease_expires_at__lt=Now()),
    lambda t, now: t.lease_expires_at is not None and t.lease_expires_at < now,
)
RUN_TIME_REACHED = Condition(
    "{t}run_at <= now()", Q(run_at__lte=Now()), lambda t, now: t.run_at is not None and t.run_at <= now
)
BELOW_CAP = Condition(
    "{t}attempt < {t}max_attempts", Q(attempt__lt=F("max_attempts")), lambda t, _: t.attempt < t.max_attempts
)

# --- Derived states --------------------------------------------------------------------------------

# A claim whose lease ran out (the reaper's and the admin's "lease lapsed"). Its receipt stays valid
# until someone else claims it (SPEC decision 2).
LEASE_LAPSED = (CLAIMED & LEASE_EXPIRED).named("lease lapsed")
# A lapsed lease that a claim may take over: one at its cap is never handed out again (SPEC decision 1).
RECLAIMABLE = (LEASE_LAPSED & BELOW_CAP).named("reclaimable")
# A lease still running: what a queue's max_claimed counts (a lapsed lease frees its slot). Served by
# index todo_live_leases (queue, lease_expires_at).
LIVE_LEASE = (CLAIMED & LEASE_UNEXPIRED).named("live lease")
# Failed below the cap: a retry is scheduled at next_retry_at.
RETRY_WAITING = (FAILED & RETRY_SCHEDULED).named("retry-waiting")
# Retry-waiting and due: claimable now, and the retry scheduler's work. Served by index todo_retry_due (the
# reaper, all queues) and todo_retry_queue_due (claims, per queue).
RETRY_DUE = (RETRY_WAITING & RETRY_TIME_REACHED).named("retry due")
# Failed with no retry scheduled: only an operator brings it back (SPEC decision 4).
DEAD_LETTER = (FAILED & NO_RETRY).named("dead-letter")
# Scheduled and due: claimable by the claim scan at once (like a lapsed lease, SPEC decision 1), promoted
# to pending by the reaper. Served by todo_scheduled_due (queue, run_at) WHERE state = 'scheduled'.
SCHEDULED_DUE = (SCHEDULED & RUN_TIME_REACHED).named("scheduled due")
# What a claim may take (besides the assignee rule): pending, a reclaimable lapsed lease, a due retry,
# a scheduled todo whose run_at has come.
CLAIMABLE = (PENDING | RECLAIMABLE | RETRY_DUE | SCHEDULED_DUE).named("claimable")
# The todos that can still run: they hold their idempotency key (SPEC decision 3); done and
# dead-lettered todos free it. Also the unique constraint's predicate, which sql.CREATE's ON CONFLICT
# must repeat for PostgreSQL to use that partial index as the arbiter.
RUNNABLE = ((PENDING | CLAIMED | SCHEDULED | WAITING) | RETRY_WAITING).named("runnable")
# What an awaited result waits for (GET /api/v1/todos/<id>/?wait_seconds=N, MCP get_todo): the todo will not
# change on its own any more. Done, a dead-letter, or cancelled.
FINISHED = (DONE | DEAD_LETTER | CANCELLED).named("finished")
# Operators may change the priority of, or run now, only what has not started.
PRIORITY_CHANGEABLE = (PENDING | SCHEDULED).named("priority changeable")
# What cancel may take: work not yet finished and not dead (a dead-letter is the operator's: retry or
# discard): pending, scheduled, claimed, waiting and retry-waiting todos.
CANCELLABLE = ((PENDING | CLAIMED | SCHEDULED | WAITING) | RETRY_WAITING).named("cancellable")

# --- Scheduling's other vocabulary (issue 12) --------------------------------------------------------

PRIORITY_MIN, PRIORITY_MAX = -100, 100  # lower runs first (Graphile Worker's convention)
# Claim order, everywhere a claim chooses: priority first (lower first), then time (run_at: creation time
# unless scheduled). created_at would do for time only while nothing is scheduled.
CLAIM_ORDER = ("priority", "run_at")


def claim_order_sql(alias: str = "") -> str:
    """CLAIM_ORDER as an ORDER BY list for todos/sql/ (``alias`` prefixes each column)."""
    return ", ".join(f"{alias}.{c}" if alias else c for c in CLAIM_ORDER)


# Every named condition, for the agreement test.
ALL: tuple[Condition, ...] = (
    PENDING,
    CLAIMED,
    DONE,
    FAILED,
    CANCELLED,
    WAITING,
    LEASE_LAPSED,
    LIVE_LEASE,
    RECLAIMABLE,
    RETRY_WAITING,
    RETRY_DUE,
    DEAD_LETTER,
    SCHEDULED,
    SCHEDULED_DUE,
    CLAIMABLE,
    RUNNABLE,
    CANCELLABLE,
    PRIORITY_CHANGEABLE,
    FINISHED,
)

# What the admin shows for a todo: each todo is exactly one of these.
DISPLAYED: tuple[Condition, ...] = (
    PENDING,
    SCHEDULED,
    WAITING,
    CLAIMED,
    DONE,
    RETRY_WAITING,
    DEAD_LETTER,
    CANCELLED,
)


def label(todo: Todo) -> str:
    """The state as the admin shows it: failed reads as retry-waiting or dead-letter."""
    return label_of(todo.state, dead_letter=DEAD_LETTER.holds(todo))


def label_of(state: str, *, dead_letter: bool) -> str:
    """``label`` for when only the state and whether it is a dead-letter are known (a TodoConflict)."""
    if state == TodoState.FAILED:
        return DEAD_LETTER.label if dead_letter else RETRY_WAITING.label
    return state


# --- Shapes: what each stored state implies about the other columns ---------------------------------
# Derived from the transitions of todos/sql/; todos/models.py turns each into a CHECK constraint, so
# a write by any path (ORM, raw SQL, a data migration) that breaks one fails instead of confusing the
# queue. The lease's three columns move together except that fail, complete and the reaper keep the
# owner for the record, and the reaper keeps a lapsed receipt (on pending or, at the cap, a dead-letter)
# so that the slow worker that holds it may still finish (SPEC decision 2).

_LEASE_HELD = Q(owner__isnull=False, lease_id__isnull=False, lease_expires_at__isnull=False)
_NO_LEASE = Q(lease_id__isnull=True, lease_expires_at__isnull=True)
_UNFINISHED = Q(completed_at__isnull=True)

SHAPES: dict[str, Q] = {
    TodoState.PENDING: NO_RETRY.q & _UNFINISHED,
    TodoState.CLAIMED: _LEASE_HELD & NO_RETRY.q & _UNFINISHED,
    TodoState.DONE: Q(completed_at__isnull=False) & _NO_LEASE & NO_RETRY.q,
    TodoState.FAILED: _UNFINISHED & (NO_RETRY.q | _NO_LEASE),
    # Waiting for its run_at: never claimed since it was created (no owner, no lease), nothing to retry.
    TodoState.SCHEDULED: Q(owner__isnull=True, run_at__isnull=False) & _NO_LEASE & NO_RETRY.q & _UNFINISHED,
    TodoState.CANCELLED: Q(completed_at__isnull=False) & _NO_LEASE & NO_RETRY.q,
    # Waiting for something (waiting_for says what): no lease (wait gave it back), nothing to retry, not
    # finished. The owner may stay (the last claim's, as after release); create's waits have none.
    TodoState.WAITING: Q(waiting_for__isnull=False) & _NO_LEASE & NO_RETRY.q & _UNFINISHED,
}

# Whatever the state: lease_id and lease_expires_at are set and cleared together, and a receipt names
# its owner.
LEASE_COHERENT = (_NO_LEASE | Q(lease_id__isnull=False, lease_expires_at__isnull=False)) & (
    Q(lease_id__isnull=True) | Q(owner__isnull=False)
)


def shape_constraints() -> list[Any]:
    """The CHECK constraints of todos/models.py: the state's values, each state's shape, the lease."""
    checks = [models.CheckConstraint(condition=Q(state__in=TodoState.values), name="todo_state_valid")]
    checks += [
        models.CheckConstraint(condition=~state_in(state).q | shape, name=f"todo_{state}_shape")
        for state, shape in SHAPES.items()
    ]
    checks.append(models.CheckConstraint(condition=LEASE_COHERENT, name="todo_lease_coherent"))
    return checks


# --- Task protocols (issue 33): one table from a todo to MCP task statuses and A2A task states --------
# A todo is the task of every task protocol Switchboard serves: the MCP Tasks of the 2025-11-25 wire
# (todos/mcp/tasks_2025.py) and of the 2026-07-28 extension (todos/mcp/tasks.py) share one status
# vocabulary; A2A v1.0 (todos/a2a/) has its own. Each row is one displayed state (``DISPLAYED``), the
# waiting state split by what it waits for. docs/agents.md shows this table as
# ``task_state_table_markdown()`` renders it (todos/tests/test_task_states.py checks the doc).

# What a waiting todo waits for (its waiting_for's key) that a person or another agent answers: the task
# needs input. A wait on todos or an event resolves on its own: the task is still working.
INPUT_WAITS = ("token", "manual", "people")


def waits_for_input(todo: Todo) -> bool:
    waiting_for = todo.waiting_for
    return (
        todo.state == TodoState.WAITING and isinstance(waiting_for, dict) and any(k in waiting_for for k in INPUT_WAITS)
    )


@dataclass(frozen=True)
class TaskState:
    """How one state of a todo reads on each task protocol, and the rows in it (``q``, for a filter)."""

    todo: str  # the state as docs and the admin name it
    mcp: str  # MCP task status, both wires (working, input_required, completed, failed, cancelled)
    a2a: str  # A2A v1.0 TaskState, its ProtoJSON name
    q: Q


_WAITS_FOR_INPUT = Q(waiting_for__has_any_keys=list(INPUT_WAITS))

TASK_PENDING = TaskState("pending, scheduled", "working", "TASK_STATE_SUBMITTED", (PENDING | SCHEDULED).q)
TASK_CLAIMED = TaskState("claimed, retry-waiting", "working", "TASK_STATE_WORKING", (CLAIMED | RETRY_WAITING).q)
TASK_WAITING = TaskState("waiting on todos or an event", "working", "TASK_STATE_WORKING", WAITING.q & ~_WAITS_FOR_INPUT)
TASK_INPUT = TaskState(
    "waiting on a token, a person or a manual resolve",
    "input_required",
    "TASK_STATE_INPUT_REQUIRED",
    WAITING.q & _WAITS_FOR_INPUT,
)
TASK_DONE = TaskState("done", "completed", "TASK_STATE_COMPLETED", DONE.q)
TASK_DEAD = TaskState("dead-letter", "failed", "TASK_STATE_FAILED", DEAD_LETTER.q)
TASK_CANCELLED = TaskState("cancelled", "cancelled", "TASK_STATE_CANCELED", CANCELLED.q)

TASK_STATES: tuple[TaskState, ...] = (
    TASK_PENDING,
    TASK_CLAIMED,
    TASK_WAITING,
    TASK_INPUT,
    TASK_DONE,
    TASK_DEAD,
    TASK_CANCELLED,
)


def task_state(todo: Todo) -> TaskState:
    """The row of ``TASK_STATES`` that ``todo`` is in (a retry-waiting todo is still being worked on)."""
    if todo.state == TodoState.DONE:
        return TASK_DONE
    if todo.state == TodoState.CANCELLED:
        return TASK_CANCELLED
    if todo.state == TodoState.FAILED:
        return TASK_DEAD if DEAD_LETTER.holds(todo) else TASK_CLAIMED
    if todo.state == TodoState.WAITING:
        return TASK_INPUT if waits_for_input(todo) else TASK_WAITING
    if todo.state == TodoState.CLAIMED:
        return TASK_CLAIMED
    return TASK_PENDING


def a2a_state_q(a2a: str) -> Q | None:
    """The rows whose A2A task state is ``a2a`` (a ListTasks filter), or None for a state no todo is in."""
    rows = [row.q for row in TASK_STATES if row.a2a == a2a]
    if not rows:
        return None
    condition = rows[0]
    for row in rows[1:]:
        condition |= row
    return condition


def task_state_table_markdown() -> str:
    """``TASK_STATES`` as the Markdown table docs/agents.md shows."""
    lines = [
        "| todo | MCP task status (2025-11-25 and 2026-07-28) | A2A v1.0 task state |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {row.todo} | `{row.mcp}` | `{row.a2a}` |" for row in TASK_STATES]
    return "\n".join(lines) + "\n"
