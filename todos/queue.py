"""The todo state machine: the only code that writes a todo's state.

Each transition is one guarded UPDATE (see todos/sql.py), named with SPEC.md's verbs so call sites read
``queue.complete(...)``. A guard that matches no row is classified by a follow-up read: TodoNotFound if
the todo is absent or outside the caller's scopes, TodoConflict (with the current state) otherwise.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg.types.json import Jsonb

from switchboard.metrics import LEASE_LAPSES, TRANSITIONS
from todos import sql
from todos.errors import InvalidTransitionInput, QueueError, TodoConflict, TodoNotFound
from todos.models import (
    MAX_DELAY_SECONDS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    Agent,
    Queue,
    Todo,
    glob_to_like,
    new_todo_id,
    validate_queue_name,
)

logger = logging.getLogger(__name__)

JSON = Any
ALL_QUEUES = ["%"]
MAX_CLAIM_BATCH = 100


@dataclass(frozen=True)
class LapseResult:
    requeued: int
    dead_lettered: int


@dataclass(frozen=True)
class ReapResult:
    requeued: int = 0
    dead_lettered: int = 0
    retries_promoted: int = 0
    scheduled_promoted: int = 0

    @property
    def total(self) -> int:
        return self.requeued + self.dead_lettered + self.retries_promoted + self.scheduled_promoted


def _cursor(db: BaseDatabaseWrapper) -> CursorWrapper:
    """A cursor on Django's connection (same transaction, error wrapping and query logging as
    ``connection.cursor()``) that binds parameters on the server.

    Django's own cursors bind on the client, so psycopg can never prepare their statements. These few
    statements run thousands of times a second, and planning the claim scan costs more than running it:
    bound on the server they are prepared once per connection (OPTIONS prepare_threshold in settings;
    psycopg never prepares client-bound statements, so the ORM is unaffected).
    """
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    raw = psycopg.Cursor(db.connection)
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)


def _field_positions() -> tuple[list[int], list[tuple[int, Any]]]:
    """Where each of the model's concrete fields sits among sql.TODO_COLUMNS, and which need decoding."""
    columns = [c.strip() for c in sql.TODO_COLUMNS.split(",")]
    fields = Todo._meta.concrete_fields
    order = [columns.index(f.column) for f in fields]
    decode = [(i, f) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]  # the JSON fields
    return order, decode


_ORDER, _DECODE = _field_positions()
_ATTNAMES = [f.attname for f in Todo._meta.concrete_fields]


def _todo(row: tuple[Any, ...], db: BaseDatabaseWrapper) -> Todo:
    """The Todo that Todo.objects.raw() would build from a row of sql.TODO_COLUMNS, for a fraction of its
    cost: no per-query column introspection, and (while nothing listens to Todo's init signals) no
    Model.__init__, which only sets the same attributes one by one. bench/queue_throughput.py measures it."""
    values = [row[i] for i in _ORDER]
    for i, field in _DECODE:
        values[i] = field.from_db_value(values[i], None, db)
    if pre_init.has_listeners(Todo) or post_init.has_listeners(Todo):
        return Todo.from_db(db.alias, _ATTNAMES, values)
    todo = Todo.__new__(Todo)
    todo.__dict__.update(zip(_ATTNAMES, values, strict=True))
    todo._state = ModelState()
    todo._state.adding = False
    todo._state.db = db.alias
    return todo


F = TypeVar("F", bound=Callable[..., Any])


def _counted(verb: str, outcome: Callable[[Any], str] = lambda _result: "ok") -> Callable[[F], F]:
    """Count each call in switchboard_todo_transitions_total{verb, outcome}: the outcome of the result,
    or the code of the QueueError a miss raised. One counter increment: a few microseconds."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                result = function(*args, **kwargs)
            except QueueError as exc:
                TRANSITIONS.labels(verb=verb, outcome=exc.code).inc()
                raise
            TRANSITIONS.labels(verb=verb, outcome=outcome(result)).inc()
            return result

        return counted  # type: ignore[return-value]

    return decorate


def _took_over_a_lapsed_lease(todo: Todo) -> bool:
    """True if the claim that returned ``todo`` took it over from a lapsed lease: that claim appended a
    "lease expired" entry stamped with its own claimed_at (todos/sql.py, _CLAIM_SET)."""
    last = todo.errors[-1] if todo.errors else None
    if not isinstance(last, dict) or "reclaimed_at" not in last or todo.claimed_at is None:
        return False
    try:
        return datetime.fromisoformat(last["reclaimed_at"]) == todo.claimed_at
    except (TypeError, ValueError):
        return False


def _count_lapsed_claims(todos: Iterable[Todo]) -> None:
    lapsed = sum(1 for todo in todos if _took_over_a_lapsed_lease(todo))
    if lapsed:
        LEASE_LAPSES.labels(detected_by="claim", outcome="reclaimed").inc(lapsed)


def _rows(statement: str, params: dict[str, Any]) -> list[Todo]:
    """Run a statement that returns sql.TODO_COLUMNS; build its rows into Todos."""
    db = connections[DEFAULT_DB_ALIAS]  # one lookup of the thread's connection, not one per use
    with _cursor(db) as cursor:
        cursor.execute(statement, params)
        return [_todo(row, db) for row in cursor.fetchall()]


def _rows_reviving(statement: str, params: dict[str, Any], action: str, todo_id: str) -> list[Todo]:
    """Run a statement that can make a finished todo runnable again, which fails if a newer runnable
    todo holds its idempotency key. Inside a caller's transaction a savepoint keeps that failure
    from aborting the caller's work."""
    try:
        if connection.in_atomic_block:
            with transaction.atomic():
                return _rows(statement, params)
        return _rows(statement, params)
    except IntegrityError as exc:
        raise TodoConflict(
            f"Cannot {action} {todo_id}: a newer runnable todo holds its idempotency key.",
            state="failed",
            reason="idempotency_key_taken",
        ) from exc


def _check_priority(priority: Any) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidTransitionInput(
            f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX} (lower runs first).", field="priority"
        )


def _visible(agent: Agent | None) -> list[str]:
    return agent.visible_like_patterns() if agent is not None else ALL_QUEUES


def _owner(agent: Agent, worker: str | None) -> str:
    return f"{agent.name}/{worker}" if worker else agent.name


def _lease_seconds(lease_seconds: float | None) -> float:
    return float(lease_seconds if lease_seconds is not None else settings.QUEUE_DEFAULT_LEASE_SECONDS)


def _miss(todo_id: str, agent: Agent | None, action: str, lease_id: str | None = None) -> Exception:
    """Classify a guarded UPDATE that touched nothing."""
    with connection.cursor() as cursor:
        cursor.execute(sql.CURRENT_STATE, {"id": todo_id, "visible": _visible(agent)})
        row = cursor.fetchone()
    if row is None:
        return TodoNotFound(f"No todo {todo_id}.")
    state, no_retry, current_lease, owner_agent = row
    dead = state == "failed" and no_retry
    if lease_id is not None and (current_lease != lease_id or (agent is not None and owner_agent != agent.name)):
        return TodoConflict(
            f"Cannot {action} {todo_id}: the lease_id is not the current receipt (the lease lapsed and the todo "
            "was claimed again, or it was already finished, failed or released).",
            state=state,
            dead_letter=dead,
        )
    return TodoConflict(f"Cannot {action} {todo_id} while it is {state}.", state=state, dead_letter=dead)


@_counted("create", lambda result: "ok" if result[1] else "duplicate")
def create(
    *,
    queue: str,
    agent: Agent | None = None,
    kind: str = "",
    title: str = "",
    payload: JSON = None,
    source: str = "",
    idempotency_key: str | None = None,
    assignee: str | None = None,
    max_attempts: int | None = None,
    event_id: str | None = None,
    run_at: datetime | None = None,
    delay_seconds: float | None = None,
    priority: int = 0,
) -> tuple[Todo, bool]:
    """-> pending, or -> scheduled when ``run_at`` (or now + ``delay_seconds``; not both) is in the future.
    Idempotent: if a runnable todo (scheduled ones included) holds (queue, idempotency_key), return it and
    False. ``priority`` orders claims, lower first.

    ``agent`` None is the system (webhook routing, schedules); an agent may create only in its create scopes.
    """
    try:
        validate_queue_name(queue)
    except Exception as exc:  # ValidationError: report it in the queue's own error type
        raise InvalidTransitionInput(str(exc.messages[0]), field="queue") from exc  # type: ignore[attr-defined]
    if agent is not None and not agent.may_create_in(queue):
        raise InvalidTransitionInput(f"Queue {queue!r} is not in this agent's create scopes.", field="queue")
    _check_priority(priority)
    if run_at is not None and delay_seconds is not None:
        raise InvalidTransitionInput("Give run_at or delay_seconds, not both.", field="run_at")
    if run_at is not None and run_at.tzinfo is None:
        raise InvalidTransitionInput("run_at needs a time zone offset (RFC 3339).", field="run_at")
    if delay_seconds is not None and not 0 <= delay_seconds <= MAX_DELAY_SECONDS:
        raise InvalidTransitionInput(f"delay_seconds must be between 0 and {MAX_DELAY_SECONDS}.", field="delay_seconds")
    params = {
        "id": new_todo_id(),
        "queue": queue,
        "source": source,
        "kind": kind,
        "title": title,
        "payload": Jsonb(payload if payload is not None else {}),
        "event_id": event_id,
        "idempotency_key": idempotency_key,
        "assignee": assignee,
        "max_attempts": max_attempts or settings.QUEUE_DEFAULT_MAX_ATTEMPTS,
        "run_at": run_at,
        "delay": delay_seconds,
        "priority": priority,
    }
    # The holder of the key may finish between our conflicting INSERT and the read; then insert again.
    for _ in range(5):
        inserted = _rows(sql.CREATE, params)
        if inserted:
            return inserted[0], True
        existing = _rows(sql.RUNNABLE_BY_KEY, params)
        if existing:
            return existing[0], False
    raise TodoConflict("The idempotency key is changing hands too fast; try again.", state="unknown")


@_counted("claim_next", lambda todos: "ok" if todos else "empty")
def claim_next(
    *,
    agent: Agent,
    queues: Sequence[str] | None = None,
    limit: int = 1,
    lease_seconds: float | None = None,
    worker: str | None = None,
) -> list[Todo]:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, up to ``limit`` todos, by priority
    (lower first), then run_at.

    ``queues`` (names or globs) narrows the agent's claim scopes; it never widens them.
    """
    if not 1 <= limit <= MAX_CLAIM_BATCH:
        raise InvalidTransitionInput(f"limit must be between 1 and {MAX_CLAIM_BATCH}.", field="limit")
    todos = _rows(
        sql.CLAIM_NEXT,
        {
            "scopes": agent.claim_like_patterns(),
            "wanted": [glob_to_like(q) for q in queues] if queues else ALL_QUEUES,
            "agent": agent.name,
            "owner": _owner(agent, worker),
            "limit": limit,
            "lease_seconds": _lease_seconds(lease_seconds),
        },
    )
    todos.sort(key=lambda t: (t.priority, t.run_at))  # UPDATE ... RETURNING keeps no order
    _count_lapsed_claims(todos)
    return todos


@_counted("claim")
def claim(todo_id: str, *, agent: Agent, lease_seconds: float | None = None, worker: str | None = None) -> Todo:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, for this one todo."""
    rows = _rows(
        sql.CLAIM_ONE,
        {
            "id": todo_id,
            "scopes": agent.claim_like_patterns(),
            "agent": agent.name,
            "owner": _owner(agent, worker),
            "lease_seconds": _lease_seconds(lease_seconds),
        },
    )
    if rows:
        _count_lapsed_claims(rows)
        return rows[0]
    raise _miss(todo_id, agent, "claim")


def _with_receipt(statement: str, action: str, todo_id: str, agent: Agent, lease_id: str, **params: Any) -> Todo:
    rows = _rows_reviving(
        statement,
        {"id": todo_id, "lease_id": lease_id, "agent": agent.name, "visible": _visible(agent), **params},
        action,
        todo_id,
    )
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, action, lease_id)


@_counted("heartbeat")
def heartbeat(todo_id: str, *, agent: Agent, lease_id: str, lease_seconds: float | None = None) -> Todo:
    """claimed -> claimed with lease_expires_at = now() + lease. Needs the current receipt."""
    return _with_receipt(
        sql.HEARTBEAT, "heartbeat", todo_id, agent, lease_id, lease_seconds=_lease_seconds(lease_seconds)
    )


@_counted("complete")
def complete(todo_id: str, *, agent: Agent, lease_id: str, result: JSON = None) -> Todo:
    """claimed -> done. Needs the current receipt."""
    return _with_receipt(
        sql.COMPLETE, "complete", todo_id, agent, lease_id, result=Jsonb(result) if result is not None else None
    )


def complete_many(items: Iterable[tuple[str, str, JSON]], *, agent: Agent) -> list[Todo | TodoNotFound | TodoConflict]:
    """complete for a batch of (todo_id, lease_id, result) in one statement; one outcome per item, in order."""
    items = list(items)
    if not items:
        return []
    done = {
        todo.id: todo
        for todo in _rows(
            sql.COMPLETE_MANY,
            {
                "ids": [i for i, _, _ in items],
                "lease_ids": [lease for _, lease, _ in items],
                "results": [Jsonb(r) if r is not None else None for _, _, r in items],
                "agent": agent.name,
                "visible": _visible(agent),
            },
        )
    }
    outcomes: list[Todo | TodoNotFound | TodoConflict] = []
    for todo_id, lease_id, _ in items:
        if todo_id in done:
            outcomes.append(done.pop(todo_id))
        else:
            outcomes.append(_miss(todo_id, agent, "complete", lease_id))  # type: ignore[arg-type]
    for outcome in outcomes:
        # Each item counts as one complete, as if it had been its own call.
        TRANSITIONS.labels(verb="complete", outcome="ok" if isinstance(outcome, Todo) else outcome.code).inc()
    return outcomes


@_counted("fail", lambda todo: "retry_scheduled" if todo.next_retry_at is not None else "dead_lettered")
def fail(todo_id: str, *, agent: Agent, lease_id: str, error: str = "", retry_in_seconds: float | None = None) -> Todo:
    """claimed -> failed: a retry is scheduled below the cap, a dead-letter at it. Needs the current receipt."""
    return _with_receipt(
        sql.FAIL,
        "fail",
        todo_id,
        agent,
        lease_id,
        error=error,
        retry_in=retry_in_seconds,
        backoff_base=float(settings.QUEUE_RETRY_BASE_SECONDS),
        backoff_cap=float(settings.QUEUE_RETRY_CAP_SECONDS),
    )


@_counted("release")
def release(todo_id: str, *, agent: Agent, lease_id: str) -> Todo:
    """claimed -> pending, giving the attempt back. Needs the current receipt."""
    return _with_receipt(sql.RELEASE, "release", todo_id, agent, lease_id)


@_counted("retry_dead_letter")
def retry_dead_letter(todo_id: str, *, mode: str, operator: str, note: str = "", agent: Agent | None = None) -> Todo:
    """dead-letter -> pending. ``mode`` "reset" grants a full new budget, "once" exactly one more try.

    ``operator`` (a username or agent name) and ``note`` are recorded in the todo's errors.
    """
    if mode not in ("reset", "once"):
        raise InvalidTransitionInput("mode must be 'reset' or 'once'.", field="mode")
    rows = _rows_reviving(
        sql.RETRY_DEAD_LETTER,
        {"id": todo_id, "mode": mode, "operator": operator, "note": note, "visible": _visible(agent)},
        "retry",
        todo_id,
    )
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "retry")


def requeue_lapsed(*, batch: int) -> LapseResult:
    """One batch of lapsed leases: -> pending below the cap, -> dead-letter at it."""
    with _cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.execute(sql.REQUEUE_LAPSED, {"batch": batch})
        states = [state for _, _, state in cursor.fetchall()]
    dead = states.count("failed")
    if states:
        LEASE_LAPSES.labels(detected_by="reaper", outcome="requeued").inc(len(states) - dead)
        LEASE_LAPSES.labels(detected_by="reaper", outcome="dead_lettered").inc(dead)
    return LapseResult(requeued=len(states) - dead, dead_lettered=dead)


def promote_due_retries(*, batch: int) -> int:
    """One batch of failed todos whose retry is due: -> pending."""
    with _cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.execute(sql.PROMOTE_DUE_RETRIES, {"batch": batch})
        promoted = len(cursor.fetchall())
    if promoted:
        TRANSITIONS.labels(verb="retry_due", outcome="ok").inc(promoted)
    return promoted


def promote_due_scheduled(*, batch: int) -> int:
    """One batch of scheduled todos whose run_at has come: -> pending."""
    with _cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.execute(sql.PROMOTE_DUE_SCHEDULED, {"batch": batch})
        promoted = len(cursor.fetchall())
    if promoted:
        TRANSITIONS.labels(verb="scheduled_due", outcome="ok").inc(promoted)
    return promoted


def _in_batches(step: Callable[[], int], batch: int, should_stop: Any) -> int:
    total = 0
    while not (should_stop and should_stop()):
        n = step()
        total += n
        if n < batch:
            break
    return total


def reap_once(*, batch: int, should_stop: Any = None) -> ReapResult:
    """One sweep of the sidecar: lapsed leases, then due retries, then due scheduled todos, batch after
    batch until none are left (or ``should_stop()`` says so between batches)."""
    requeued = dead = 0
    while True:
        lapse = requeue_lapsed(batch=batch)
        requeued += lapse.requeued
        dead += lapse.dead_lettered
        if lapse.requeued + lapse.dead_lettered < batch or (should_stop and should_stop()):
            break
    promoted = _in_batches(lambda: promote_due_retries(batch=batch), batch, should_stop)
    scheduled = _in_batches(lambda: promote_due_scheduled(batch=batch), batch, should_stop)
    return ReapResult(requeued=requeued, dead_lettered=dead, retries_promoted=promoted, scheduled_promoted=scheduled)


def known_queues() -> list[str]:
    return list(Queue.objects.order_by("name").values_list("name", flat=True))


def retry_dead_letter_many(
    ids: Sequence[str], *, mode: str, operator: str, note: str = "", agent: Agent | None = None
) -> list[Todo]:
    """retry_dead_letter for a batch, in one statement; returns the todos retried (the others did not
    pass the guard). A newer runnable todo holding one row's key fails the whole statement with
    TodoConflict(reason="idempotency_key_taken"): retry those one by one to find it."""
    if mode not in ("reset", "once"):
        raise InvalidTransitionInput("mode must be 'reset' or 'once'.", field="mode")
    return _rows_reviving(
        sql.RETRY_DEAD_LETTER_MANY,
        {"ids": list(ids), "mode": mode, "operator": operator, "note": note, "visible": _visible(agent)},
        "retry",
        "a batch",
    )


def retry_now_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """retry-waiting (failed, next_retry_at set) -> pending now, for each id that is retry-waiting."""
    return _rows(sql.RETRY_NOW, {"ids": list(ids), "operator": operator, "visible": _visible(agent)})


@_counted("retry_now")
def retry_now(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """retry-waiting (failed, next_retry_at set) -> pending now, without waiting for the backoff."""
    rows = retry_now_many([todo_id], operator=operator, agent=agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "retry now")


def discard_many(ids: Sequence[str], *, operator: str, reason: str = "", agent: Agent | None = None) -> list[Todo]:
    """pending, scheduled or failed -> done with result {"discarded_by", "reason"}, for each id that qualifies."""
    return _rows(sql.DISCARD, {"ids": list(ids), "operator": operator, "reason": reason, "visible": _visible(agent)})


@_counted("discard")
def discard(todo_id: str, *, operator: str, reason: str = "", agent: Agent | None = None) -> Todo:
    """pending, scheduled or failed -> done with result {"discarded_by", "reason"}. Not from claimed:
    force-release first."""
    rows = discard_many([todo_id], operator=operator, reason=reason, agent=agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "discard")


def force_release_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """claimed -> pending whatever the receipt, for each id that is claimed."""
    return _rows(sql.FORCE_RELEASE, {"ids": list(ids), "operator": operator, "visible": _visible(agent)})


@_counted("force_release")
def force_release(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """claimed -> pending whatever the receipt (a stuck worker); recorded in errors, attempt kept."""
    rows = force_release_many([todo_id], operator=operator, agent=agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "force-release")


def run_now_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """scheduled -> pending now (run_at = now()), for each id that is scheduled."""
    return _rows(sql.RUN_NOW, {"ids": list(ids), "operator": operator, "visible": _visible(agent)})


@_counted("run_now")
def run_now(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """scheduled -> pending now, without waiting for run_at; recorded in errors."""
    rows = run_now_many([todo_id], operator=operator, agent=agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "run now")


def set_priority_many(ids: Sequence[str], *, priority: int, agent: Agent | None = None) -> list[Todo]:
    """The priority of each id that is pending or scheduled."""
    _check_priority(priority)
    return _rows(sql.SET_PRIORITY, {"ids": list(ids), "priority": priority, "visible": _visible(agent)})


@_counted("set_priority")
def set_priority(todo_id: str, *, priority: int, agent: Agent | None = None) -> Todo:
    """A pending or scheduled todo's priority (409 once it has been claimed or finished)."""
    rows = set_priority_many([todo_id], priority=priority, agent=agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "change the priority of")
