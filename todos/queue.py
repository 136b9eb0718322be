"""The todo state machine: the only code that writes a todo's state.

Each transition is one guarded UPDATE (see todos/sql.py), named with SPEC.md's verbs so call sites read
``queue.complete(...)``. A guard that matches no row is classified by a follow-up read: TodoNotFound if
the todo is absent or outside the caller's scopes, TodoConflict (with the current state) otherwise.
Every door, the batch ones included, is counted in switchboard_todo_transitions_total (todos/metrics.py);
the cursor and row plumbing is in todos/rows.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from todos import selectors, sql, states, tracing, waitpoints
from todos.errors import InvalidTransitionInput, QueuesForbidden, TodoConflict, TodoNotFound
from todos.metrics import LEASE_LAPSES, TRANSITIONS, count_lapsed_claims, counted, counted_batch
from todos.models import (
    MAX_FAIR_KEY_CHARS,
    Agent,
    Todo,
    TodoState,
    glob_to_like,
    hash_token,
    new_todo_id,
    validate_queue_name,
)
from todos.rows import fetch_todos, fetch_todos_reviving, fetchall
from todos.states import MAX_DELAY_SECONDS, PRIORITY_MAX, PRIORITY_MIN

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
    waits_timed_out: int = 0

    @property
    def total(self) -> int:
        return (
            self.requeued + self.dead_lettered + self.retries_promoted + self.scheduled_promoted + self.waits_timed_out
        )


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
    state, dead, current_lease, owner_agent, paused, limited = row
    if state == TodoState.CANCELLED:
        # A cancel revoked the lease: the worker learns here that it should stop.
        return TodoConflict(f"Cannot {action} {todo_id}: it was cancelled.", state=state, dead_letter=False)
    if action == "claim" and state == TodoState.PENDING and (paused or limited):
        reason = "queue_paused" if paused else "queue_limit"
        why = "its queue is paused" if paused else "its queue is at its concurrency or rate limit"
        return TodoConflict(f"Cannot claim {todo_id} now: {why}.", state=state, dead_letter=dead, reason=reason)
    if (
        action == "heartbeat"
        and lease_id == current_lease
        and (agent is None or owner_agent == agent.name)
        and state in (TodoState.PENDING, TodoState.CLAIMED)
    ):
        # The receipt is current, so the lease lapsed and taking it back was refused (sql.HEARTBEAT).
        reason = "queue_paused" if paused else "queue_limit"
        why = "its queue is paused" if paused else "its queue is at its max_claimed"
        return TodoConflict(
            f"Cannot heartbeat {todo_id}: its lease lapsed and {why}, so it cannot be taken back.",
            state=state,
            dead_letter=dead,
            reason=reason,
        )
    if lease_id is not None and (current_lease != lease_id or (agent is not None and owner_agent != agent.name)):
        return TodoConflict(
            f"Cannot {action} {todo_id}: the lease_id is not the current receipt (the lease lapsed and the todo "
            "was claimed again, or it was already finished, failed or released).",
            state=state,
            dead_letter=dead,
        )
    return TodoConflict(f"Cannot {action} {todo_id} while it is {state}.", state=state, dead_letter=dead)


@counted("create", lambda result: "ok" if result[1] else "duplicate")
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
    fair_key: str = "",
    traceparent: str | None = None,
) -> tuple[Todo, bool]:
    """-> pending, or -> scheduled when ``run_at`` (or now + ``delay_seconds``; not both) is in the future.
    Idempotent: if a runnable todo (scheduled ones included) holds (queue, idempotency_key), return it and
    False. ``priority`` orders claims, lower first.

    ``agent`` None is the system (webhook routing, schedules); an agent may create only in its create scopes.
    ``fair_key``: the tenant a fair queue shares its claims by (todos/sql.py, CLAIM_NEXT).
    """
    if not isinstance(queue, str):
        raise InvalidTransitionInput("queue must be a string.", field="queue")
    try:
        validate_queue_name(queue)
    except ValidationError as exc:  # reported in the queue's own error type
        raise InvalidTransitionInput(exc.messages[0], field="queue") from exc
    if agent is not None and not agent.may_create_in(queue):
        raise InvalidTransitionInput(f"Queue {queue!r} is not in this agent's create scopes.", field="queue")
    _check_priority(priority)
    if not isinstance(fair_key, str) or len(fair_key) > MAX_FAIR_KEY_CHARS or "\x00" in fair_key:
        raise InvalidTransitionInput(
            f"fair_key must be text of at most {MAX_FAIR_KEY_CHARS} characters.", field="fair_key"
        )
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
        "fair_key": fair_key,
        "traceparent": traceparent,
    }
    with tracing.creating(traceparent, queue) as params["traceparent"]:
        # The holder of the key may finish between our conflicting INSERT and the read; then insert again.
        for _ in range(5):
            inserted = fetch_todos(sql.CREATE, params)
            if inserted:
                return inserted[0], True
            existing = fetch_todos(sql.RUNNABLE_BY_KEY, params)
            if existing:
                return existing[0], False
    raise TodoConflict("The idempotency key is changing hands too fast; try again.", state="unknown")


@counted("claim_next", lambda todos: "ok" if todos else "empty")
@tracing.traced("claim")
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
    if queues and (outside := agent.outside_claim_scopes(queues)):
        raise QueuesForbidden(outside)
    todos = fetch_todos(
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
    todos.sort(key=lambda t: (t.priority, t.run_at))  # UPDATE ... RETURNING keeps no order (CLAIM_ORDER)
    count_lapsed_claims(todos)
    selectors.show_awaited(todos)
    return todos


@counted("claim")
@tracing.traced("claim")
def claim(todo_id: str, *, agent: Agent, lease_seconds: float | None = None, worker: str | None = None) -> Todo:
    """pending (or lapsed, retry-due, scheduled and due) -> claimed, for this one todo."""
    rows = fetch_todos(
        sql.CLAIM_ONE,
        {
            "id": todo_id,
            "scopes": agent.claim_like_patterns(),
            "agent": agent.name,
            "owner": _owner(agent, worker),
            "limit": 1,
            "lease_seconds": _lease_seconds(lease_seconds),
        },
    )
    if rows:
        count_lapsed_claims(rows)
        selectors.show_awaited(rows)
        return rows[0]
    raise _miss(todo_id, agent, "claim")


def _with_receipt(statement: str, action: str, todo_id: str, agent: Agent, lease_id: str, **params: Any) -> Todo:
    rows = fetch_todos_reviving(
        statement,
        {"id": todo_id, "lease_id": lease_id, "agent": agent.name, "visible": _visible(agent), **params},
        action,
        todo_id,
    )
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, action, lease_id)


@counted("heartbeat")
@tracing.traced("heartbeat")
def heartbeat(
    todo_id: str,
    *,
    agent: Agent,
    lease_id: str,
    lease_seconds: float | None = None,
    progress: JSON = None,
    checkpoint: JSON = None,
) -> Todo:
    """claimed -> claimed with lease_expires_at = now() + lease. Needs the current receipt. ``progress`` and
    ``checkpoint``, when given, replace the todo's (the checkpoint is handed to whoever claims it next)."""
    return _with_receipt(
        sql.HEARTBEAT,
        "heartbeat",
        todo_id,
        agent,
        lease_id,
        lease_seconds=_lease_seconds(lease_seconds),
        progress=Jsonb(progress) if progress is not None else None,
        checkpoint=Jsonb(checkpoint) if checkpoint is not None else None,
    )


@counted("complete")
@tracing.traced("complete")
def complete(todo_id: str, *, agent: Agent, lease_id: str, result: JSON = None) -> Todo:
    """claimed -> done. Needs the current receipt."""
    return _with_receipt(
        sql.COMPLETE, "complete", todo_id, agent, lease_id, result=Jsonb(result) if result is not None else None
    )


@tracing.traced("complete")
def complete_many(items: Iterable[tuple[str, str, JSON]], *, agent: Agent) -> list[Todo | TodoNotFound | TodoConflict]:
    """complete for a batch of (todo_id, lease_id, result) in one statement; one outcome per item, in order."""
    items = list(items)
    if not items:
        return []
    done = {
        todo.id: todo
        for todo in fetch_todos(
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


@counted("fail", lambda todo: "dead_lettered" if states.DEAD_LETTER.holds(todo) else "retry_scheduled")
@tracing.traced("fail")
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


@counted("release")
@tracing.traced("release")
def release(todo_id: str, *, agent: Agent, lease_id: str) -> Todo:
    """claimed -> pending, giving the attempt back. Needs the current receipt."""
    return _with_receipt(sql.RELEASE, "release", todo_id, agent, lease_id)


@counted("retry_dead_letter")
def retry_dead_letter(todo_id: str, *, mode: str, operator: str, note: str = "", agent: Agent | None = None) -> Todo:
    """dead-letter -> pending. ``mode`` "reset" grants a full new budget, "once" exactly one more try.

    ``operator`` (a username or agent name) and ``note`` are recorded in the todo's errors.
    """
    if mode not in ("reset", "once"):
        raise InvalidTransitionInput("mode must be 'reset' or 'once'.", field="mode")
    rows = fetch_todos_reviving(
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
    swept = [state for _, _, state, _ in fetchall(sql.REQUEUE_LAPSED, {"batch": batch})]
    dead = swept.count(states.TodoState.FAILED)
    if swept:
        LEASE_LAPSES.labels(detected_by="reaper", outcome="requeued").inc(len(swept) - dead)
        LEASE_LAPSES.labels(detected_by="reaper", outcome="dead_lettered").inc(dead)
    return LapseResult(requeued=len(swept) - dead, dead_lettered=dead)


def promote_due_retries(*, batch: int) -> int:
    """One batch of failed todos whose retry is due: -> pending."""
    promoted = len(fetchall(sql.PROMOTE_DUE_RETRIES, {"batch": batch}))
    if promoted:
        TRANSITIONS.labels(verb="retry_due", outcome="ok").inc(promoted)
    return promoted


def promote_due_scheduled(*, batch: int) -> int:
    """One batch of scheduled todos whose run_at has come: -> pending."""
    promoted = len(fetchall(sql.PROMOTE_DUE_SCHEDULED, {"batch": batch}))
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
    """One sweep of the sidecar: lapsed leases, then due retries, then due scheduled todos, then waits past
    their timeout, batch after batch until none are left (or ``should_stop()`` says so between batches)."""
    requeued = dead = 0
    while True:
        lapse = requeue_lapsed(batch=batch)
        requeued += lapse.requeued
        dead += lapse.dead_lettered
        if lapse.requeued + lapse.dead_lettered < batch or (should_stop and should_stop()):
            break
    promoted = _in_batches(lambda: promote_due_retries(batch=batch), batch, should_stop)
    scheduled = _in_batches(lambda: promote_due_scheduled(batch=batch), batch, should_stop)
    timed_out = _in_batches(lambda: time_out_waits(batch=batch), batch, should_stop)
    return ReapResult(
        requeued=requeued,
        dead_lettered=dead,
        retries_promoted=promoted,
        scheduled_promoted=scheduled,
        waits_timed_out=timed_out,
    )


@counted_batch("retry_dead_letter")
def retry_dead_letter_many(
    ids: Sequence[str], *, mode: str, operator: str, note: str = "", agent: Agent | None = None
) -> list[Todo]:
    """retry_dead_letter for a batch, in one statement; returns the todos retried (the others did not
    pass the guard). A newer runnable todo holding one row's key fails the whole statement with
    TodoConflict(reason="idempotency_key_taken"): retry those one by one to find it."""
    if mode not in ("reset", "once"):
        raise InvalidTransitionInput("mode must be 'reset' or 'once'.", field="mode")
    return fetch_todos_reviving(
        sql.RETRY_DEAD_LETTER_MANY,
        {"ids": list(ids), "mode": mode, "operator": operator, "note": note, "visible": _visible(agent)},
        "retry",
        "a batch",
    )


def _retry_now(ids: Sequence[str], operator: str, agent: Agent | None) -> list[Todo]:
    return fetch_todos(sql.RETRY_NOW, {"ids": list(ids), "operator": operator, "visible": _visible(agent)})


@counted_batch("retry_now")
def retry_now_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """retry-waiting (failed, next_retry_at set) -> pending now, for each id that is retry-waiting."""
    return _retry_now(ids, operator, agent)


@counted("retry_now")
def retry_now(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """retry-waiting (failed, next_retry_at set) -> pending now, without waiting for the backoff."""
    rows = _retry_now([todo_id], operator, agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "retry now")


def _discard(ids: Sequence[str], operator: str, reason: str, agent: Agent | None) -> list[Todo]:
    return fetch_todos(
        sql.DISCARD, {"ids": list(ids), "operator": operator, "reason": reason, "visible": _visible(agent)}
    )


@counted_batch("discard")
def discard_many(ids: Sequence[str], *, operator: str, reason: str = "", agent: Agent | None = None) -> list[Todo]:
    """pending, scheduled or failed -> done with result {"discarded_by", "reason"}, for each id that qualifies."""
    return _discard(ids, operator, reason, agent)


@counted("discard")
def discard(todo_id: str, *, operator: str, reason: str = "", agent: Agent | None = None) -> Todo:
    """pending, scheduled or failed -> done with result {"discarded_by", "reason"}. Not from claimed:
    force-release first."""
    rows = _discard([todo_id], operator, reason, agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "discard")


def _force_release(ids: Sequence[str], operator: str, agent: Agent | None) -> list[Todo]:
    return fetch_todos(sql.FORCE_RELEASE, {"ids": list(ids), "operator": operator, "visible": _visible(agent)})


@counted_batch("force_release")
def force_release_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """claimed -> pending whatever the receipt, for each id that is claimed."""
    return _force_release(ids, operator, agent)


@counted("force_release")
def force_release(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """claimed -> pending whatever the receipt (a stuck worker); recorded in errors, attempt kept."""
    rows = _force_release([todo_id], operator, agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "force-release")


def _cancel(ids: Sequence[str], operator: str, reason: str, agent: Agent | None) -> list[Todo]:
    return fetch_todos(
        sql.CANCEL, {"ids": list(ids), "operator": operator, "reason": reason, "visible": _visible(agent)}
    )


@counted_batch("cancel")
@tracing.traced("cancel")
def cancel_many(ids: Sequence[str], *, operator: str, reason: str = "", agent: Agent | None = None) -> list[Todo]:
    """pending, scheduled, retry-waiting or claimed -> cancelled, for each id that is cancellable."""
    return _cancel(ids, operator, reason, agent)


@counted("cancel")
@tracing.traced("cancel")
def cancel(todo_id: str, *, operator: str, reason: str = "", agent: Agent | None = None) -> Todo:
    """pending, scheduled, retry-waiting or claimed -> cancelled (terminal). A claimed todo's lease is revoked: its
    worker's next heartbeat, complete or fail is a conflict with state cancelled. ``agent`` None: an
    operator (every queue); else the agent's claim or create scopes must cover the queue."""
    rows = _cancel([todo_id], operator, reason, agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "cancel")


def _run_now(ids: Sequence[str], operator: str, agent: Agent | None) -> list[Todo]:
    return fetch_todos(sql.RUN_NOW, {"ids": list(ids), "operator": operator, "visible": _visible(agent)})


@counted_batch("run_now")
def run_now_many(ids: Sequence[str], *, operator: str, agent: Agent | None = None) -> list[Todo]:
    """scheduled -> pending now (run_at = now()), for each id that is scheduled."""
    return _run_now(ids, operator, agent)


@counted("run_now")
def run_now(todo_id: str, *, operator: str, agent: Agent | None = None) -> Todo:
    """scheduled -> pending now, without waiting for run_at; recorded in errors."""
    rows = _run_now([todo_id], operator, agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "run now")


def _set_priority(ids: Sequence[str], priority: int, agent: Agent | None) -> list[Todo]:
    _check_priority(priority)
    return fetch_todos(sql.SET_PRIORITY, {"ids": list(ids), "priority": priority, "visible": _visible(agent)})


@counted_batch("set_priority")
def set_priority_many(ids: Sequence[str], *, priority: int, agent: Agent | None = None) -> list[Todo]:
    """The priority of each id that is pending or scheduled."""
    return _set_priority(ids, priority, agent)


@counted("set_priority")
def set_priority(todo_id: str, *, priority: int, agent: Agent | None = None) -> Todo:
    """A pending or scheduled todo's priority (409 once it has been claimed or finished)."""
    rows = _set_priority([todo_id], priority, agent)
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "change the priority of")


# --- Waits (issue 20): todos/waitpoints.py parses what a wait is for; todos/sql.py has the statements. ---


@counted("wait")
@tracing.traced("wait")
def wait(
    todo_id: str,
    *,
    agent: Agent,
    lease_id: str,
    wait_for: Any,
    timeout_seconds: Any,
    on_timeout: Any = "pending",
) -> tuple[Todo, str | None]:
    """claimed -> waiting, giving the lease and the attempt back (as release), until what ``wait_for``
    names resolves it or ``timeout_seconds`` pass. Returns the todo and, for a token wait, the token (shown
    this once: only its hash is stored). Needs the current receipt. A wait on todos that have all finished
    resolves at once."""
    spec = waitpoints.parse_for(wait_for, waiter_id=todo_id)
    timeout, on_timeout = waitpoints.check_timeout(timeout_seconds, on_timeout)
    if spec.kind == "todos":
        visible = {todo_id for todo_id, _ in fetchall(sql.AWAITED, {"ids": spec.todo_ids, "visible": _visible(agent)})}
        missing = [i for i in spec.todo_ids if i not in visible]
        if missing:
            raise TodoNotFound(f"No todo {missing[0]} (named in for.todos).")
    token = waitpoints.new_token() if spec.kind == "token" else None
    params = {
        "waiting_for": Jsonb(spec.shown),
        "timeout": timeout,
        "on_timeout": on_timeout,
        "hash": hash_token(token) if token else None,
        "source": spec.source,
        "type_like": spec.type_like,
        "match": Jsonb(spec.match) if spec.match is not None else None,
        "key": spec.key,
    }
    if spec.kind != "todos":
        return _with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params), token
    with transaction.atomic():
        todo = _with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params)
        return _attach_awaited(todo.id, spec.todo_ids) or todo, None


def _attach_awaited(waiter_id: str, ids: list[str]) -> Todo | None:
    """Within the transaction that made ``waiter_id`` waiting: make it wait for ``ids`` (their unfinished
    ones; none: it is resolved at once, and returned)."""
    rows = fetch_todos(sql.ATTACH_AWAITED, {"id": waiter_id, "ids": ids})
    return rows[0] if rows else None


@counted("resolve")
@tracing.traced("resolve")
def resolve_token(token: str, *, data: JSON = None) -> Todo:
    """waiting -> pending, by the token of a ``{"token": true}`` wait; the token is the only credential.
    Resolves once: a second resolve is a conflict, an unknown token not found."""
    digest = hash_token(token)
    rows = fetch_todos(sql.RESOLVE_TOKEN, {"hash": digest, "data": Jsonb(data)})
    if rows:
        return rows[0]
    found = fetchall(sql.WAITPOINT_BY_HASH, {"hash": digest})
    if not found:
        raise TodoNotFound("No waitpoint has this token.")
    state = Todo.objects.filter(pk=found[0][0]).values_list("state", flat=True).first() or "unknown"
    raise TodoConflict("This waitpoint was resolved already (or its todo no longer waits).", state=state)


@counted("resolve")
@tracing.traced("resolve")
def resolve(
    todo_id: str,
    *,
    by: str,
    data: JSON = None,
    agent: Agent | None = None,
    verdict: str | None = None,
    note: str = "",
) -> Todo:
    """waiting -> pending, whatever it waits for: an agent whose scopes cover the queue (``agent``), or an
    operator (``agent`` None, ``verdict`` "approved" or "rejected" with a ``note``). ``by`` names who."""
    detail: dict[str, Any] = {"data": data, "resolved_by": by}
    kind = "agent" if agent is not None else "operator"
    if verdict is not None:
        if verdict not in ("approved", "rejected"):
            raise InvalidTransitionInput("verdict must be 'approved' or 'rejected'.", field="verdict")
        detail.update(verdict=verdict, note=note)
    rows = fetch_todos(
        sql.RESOLVE_MANUAL, {"id": todo_id, "visible": _visible(agent), "by": kind, "detail": Jsonb(detail)}
    )
    if rows:
        return rows[0]
    raise _miss(todo_id, agent, "resolve")


@tracing.traced("resolve")
def resolve_events(*, event_id: str, source: str, event_type: str, payload: JSON, received_at: datetime) -> list[Todo]:
    """waiting -> pending for every open wait this stored event matches (called in the transaction that
    stores it, so a redelivery, which stores nothing, resolves nothing). Index lookups, one per scalar
    leaf of the payload (todos/waitpoints.py), never a scan of the waits."""
    todos = fetch_todos(
        sql.RESOLVE_EVENTS,
        {
            "keys": waitpoints.delivery_keys(source, payload),
            "source": source,
            "type": event_type,
            "payload": Jsonb(payload),
            "received_at": received_at,
            "event_id": event_id,
        },
    )
    if todos:
        TRANSITIONS.labels(verb="resolve", outcome="ok").inc(len(todos))
    return todos


def time_out_waits(*, batch: int) -> int:
    """One batch of waits past their timeout: -> pending (timed_out), or for on_timeout "fail" a failure
    that counts toward the attempts (a retry below the cap, a dead-letter at it)."""
    timed_out = len(
        fetchall(
            sql.TIME_OUT_WAITS,
            {
                "batch": batch,
                "backoff_base": float(settings.QUEUE_RETRY_BASE_SECONDS),
                "backoff_cap": float(settings.QUEUE_RETRY_CAP_SECONDS),
            },
        )
    )
    if timed_out:
        TRANSITIONS.labels(verb="wait_timeout", outcome="ok").inc(timed_out)
    return timed_out
