"""The todo state machine: the only code that writes a todo's state.

Each transition is one guarded UPDATE (see todos/sql/), named with SPEC.md's verbs so call sites read
``queue.complete(...)``. A guard that matches no row is classified by a follow-up read: TodoNotFound if
the todo is absent or outside the caller's scopes, TodoConflict (with the current state) otherwise.
Every door, the batch ones included, is counted in switchboard_todo_transitions_total (todos/metrics.py);
the cursor and row plumbing is in todos/rows.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from todos import event_sources, limits, selectors, sql, states, tracing, waitpoints
from todos.errors import (
    InvalidTransitionInput,
    NotAResolver,
    QueueError,
    QueuesForbidden,
    TodoConflict,
    TodoNotFound,
    TooManyWaits,
    WaitpointUsed,
)
from todos.metrics import LEASE_LAPSES, TRANSITIONS, count_lapsed_claims, counted, counted_batch
from todos.models import (
    MAX_FAIR_KEY_CHARS,
    QUEUE_NAME_RE,
    Agent,
    OnDependencyFailure,
    Todo,
    TodoState,
    Waitpoint,
    glob_to_like,
    hash_token,
    new_todo_id,
)
from todos.rows import fetch_todos, fetch_todos_reviving, fetchall
from todos.states import MAX_DELAY_SECONDS, PRIORITY_MAX, PRIORITY_MIN

logger = logging.getLogger(__name__)

JSON = Any
ALL_QUEUES = ["%"]
MAX_CLAIM_BATCH = 100
MAX_CREATE_BATCH = 1000


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


CREATE_FIELDS = (
    "queue",
    "kind",
    "title",
    "payload",
    "source",
    "idempotency_key",
    "assignee",
    "max_attempts",
    "event_id",
    "run_at",
    "delay_seconds",
    "priority",
    "fair_key",
    "traceparent",
    "depends_on",
    "depends_on_index",
    "on_dependency_failure",
)


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
    depends_on: Sequence[str] = (),
    on_dependency_failure: str = OnDependencyFailure.CANCEL,
) -> tuple[Todo, bool]:
    """-> pending, or -> scheduled when ``run_at`` (or now + ``delay_seconds``; not both) is in the future,
    or -> waiting while any of ``depends_on`` (todo ids the creator can see) is unfinished. Idempotent: if a
    runnable todo (scheduled and waiting ones included) holds (queue, idempotency_key), return it and False.
    ``priority`` orders claims, lower first. ``on_dependency_failure``: what a dependency that dead-letters
    or is cancelled does to this todo: ``cancel`` it (its history names the dependency), or ``run`` it anyway.

    ``agent`` None is the system (webhook routing, schedules); an agent may create only in its create scopes.
    ``fair_key``: the tenant a fair queue shares its claims by (todos/sql/claim.py, CLAIM_NEXT_FAIR).
    """
    item = {
        "queue": queue,
        "kind": kind,
        "title": title,
        "payload": payload,
        "source": source,
        "idempotency_key": idempotency_key,
        "assignee": assignee,
        "max_attempts": max_attempts,
        "event_id": event_id,
        "run_at": run_at,
        "delay_seconds": delay_seconds,
        "priority": priority,
        "fair_key": fair_key,
        "traceparent": traceparent,
        "depends_on": depends_on,
        "on_dependency_failure": on_dependency_failure,
    }
    return _create_many([item], agent, _WHOLE, batch=False)[0]


def create_many(items: Sequence[Mapping[str, Any]], *, agent: Agent | None = None) -> list[tuple[TodoRef, bool]]:
    """create for a batch (up to MAX_CREATE_BATCH items, each a dict of create's arguments, plus
    ``depends_on_index``: earlier items of the batch it depends on), all or nothing: one (todo's id and
    state, created) per item, in order, or an error naming the item (``todos.<index>.<field>``) and nothing
    written."""
    try:
        outcomes = _create_many(items, agent, _BRIEF, batch=True)
    except QueueError as exc:
        TRANSITIONS.labels(verb="create", outcome=exc.code).inc()
        raise
    # Each item counts as one create, as if it had been its own call.
    made = sum(1 for _, created in outcomes if created)
    if made:
        TRANSITIONS.labels(verb="create", outcome="ok").inc(made)
    if len(outcomes) > made:
        TRANSITIONS.labels(verb="create", outcome="duplicate").inc(len(outcomes) - made)
    return outcomes


class TodoRef(NamedTuple):
    """A todo as create_many answers for each item: what a batch's answer names (its id and state), and
    what matches items to rows. Reading and building a thousand whole todos would cost more than their
    INSERT (docs/benchmarks.md, "Batch create")."""

    id: str
    queue: str
    idempotency_key: str | None
    state: str


_T = TypeVar("_T", Todo, TodoRef)


@dataclass(frozen=True)
class _Reading(Generic[_T]):
    """The statements of a create, by what they hand back: whole todos (create) or TodoRefs (create_many)."""

    insert: str
    holders: str
    by_id: str
    fetch: Callable[[str, dict[str, Any]], list[_T]]


def _fetch_refs(statement: str, params: dict[str, Any]) -> list[TodoRef]:
    return [TodoRef._make(row) for row in fetchall(statement, params)]


_WHOLE = _Reading(sql.CREATE_MANY, sql.RUNNABLE_BY_KEYS, sql.TODOS_BY_ID, fetch_todos)
_BRIEF = _Reading(sql.CREATE_MANY_BRIEF, sql.RUNNABLE_BY_KEYS_BRIEF, sql.REFS_BY_ID, _fetch_refs)
_POLICIES = frozenset(OnDependencyFailure.values)
_CREATE_FIELD_SET = frozenset(CREATE_FIELDS)


def _invalid(detail: str, field: str, index: int | None) -> InvalidTransitionInput:
    if index is None:
        return InvalidTransitionInput(detail, field=field)
    return InvalidTransitionInput(f"Item {index}: {detail}", field=f"todos.{index}.{field}", index=index)


def _check_item(item: Mapping[str, Any], agent: Agent | None, index: int | None, allowed: dict[str, bool]) -> None:
    """What create refuses whoever calls it (the API's serializers bound the rest). ``allowed``: the
    queues whose create scope this batch has checked already (a batch names few queues)."""
    if unknown := sorted(item.keys() - _CREATE_FIELD_SET):
        raise _invalid("Unknown field.", unknown[0], index)
    queue = item.get("queue")
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise _invalid(
            "Queue names are 1-200 characters of letters, digits and . _ : / -, starting with a letter or digit.",
            "queue",
            index,
        )
    if agent is not None:
        if queue not in allowed:
            allowed[queue] = agent.may_create_in(queue)
        if not allowed[queue]:
            raise _invalid(f"Queue {queue!r} is not in this agent's create scopes.", "queue", index)
    priority = item.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise _invalid(
            f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX} (lower runs first).", "priority", index
        )
    fair_key = item.get("fair_key", "")
    if not isinstance(fair_key, str) or len(fair_key) > MAX_FAIR_KEY_CHARS or "\x00" in fair_key:
        raise _invalid(f"fair_key must be text of at most {MAX_FAIR_KEY_CHARS} characters.", "fair_key", index)
    run_at, delay = item.get("run_at"), item.get("delay_seconds")
    if run_at is not None and delay is not None:
        raise _invalid("Give run_at or delay_seconds, not both.", "run_at", index)
    if run_at is not None and run_at.tzinfo is None:
        raise _invalid("run_at needs a time zone offset (RFC 3339).", "run_at", index)
    if delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS:
        raise _invalid(f"delay_seconds must be between 0 and {MAX_DELAY_SECONDS}.", "delay_seconds", index)
    if item.get("on_dependency_failure", OnDependencyFailure.CANCEL) not in _POLICIES:
        raise _invalid("on_dependency_failure must be 'cancel' or 'run'.", "on_dependency_failure", index)
    earlier = item.get("depends_on_index") or ()
    if earlier and (
        index is None or any(isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < index for j in earlier)
    ):
        raise _invalid(
            "depends_on_index names earlier items of the same batch (0 to this item's index - 1).",
            "depends_on_index",
            index,
        )


def _item_row(item: Mapping[str, Any], todo_id: str, wanted: list[str], target: bool) -> dict[str, Any]:
    """An item as a row of sql.CREATE_MANY's JSON: only the values that are not the column's default."""
    row: dict[str, Any] = {"id": todo_id, "queue": item["queue"]}
    for name in _DEFAULTED:  # '' (or the default max_attempts, policy, priority 0) when falsy
        if value := item.get(name):
            row[name] = value
    for name in _NULLABLE:  # NULL when None; payload None is {}
        if (value := item.get(name)) is not None:
            row[name] = value
    if (run_at := item.get("run_at")) is not None:
        row["run_at"] = run_at.isoformat()
    if (delay := item.get("delay_seconds")) is not None:
        row["delay"] = delay
    if wanted:
        row["depends_on"] = wanted
        row["waiting_for"] = {"todos": wanted}
    if target:
        row["has_dependents"] = True
    return row


_DEFAULTED = ("source", "kind", "title", "fair_key", "max_attempts", "priority", "on_dependency_failure")
_NULLABLE = ("payload", "event_id", "idempotency_key", "assignee")


def _dependencies(item: Mapping[str, Any], ids: list[str]) -> list[str]:
    given, earlier = item.get("depends_on"), item.get("depends_on_index")
    if not given and not earlier:
        return []
    return list(dict.fromkeys([*(given or ()), *(ids[j] for j in earlier or ())]))


def _create_many(
    items: Sequence[Mapping[str, Any]], agent: Agent | None, reading: _Reading[_T], *, batch: bool
) -> list[tuple[_T, bool]]:
    if not items:
        return []
    if len(items) > MAX_CREATE_BATCH:
        raise InvalidTransitionInput(f"At most {MAX_CREATE_BATCH} todos a batch.", field="todos")
    allowed: dict[str, bool] = {}
    for index, item in enumerate(items):
        _check_item(item, agent, index if batch else None, allowed)
    ids = [new_todo_id() for _ in items]
    # Each item's dependencies, in the order given (duplicates dropped): ids, then earlier items (by the id
    # generated for them: an item that turns out to exist already is repointed below).
    wanted = [_dependencies(item, ids) for item in items]
    targets = {j for item in items for j in item.get("depends_on_index") or ()}
    rows = [_item_row(item, ids[n], wanted[n], n in targets) for n, item in enumerate(items)]
    with tracing.creating_many([(i.get("traceparent"), i["queue"]) for i in items]) as traceparents:
        for row, traceparent in zip(rows, traceparents, strict=True):
            if traceparent is not None:
                row["traceparent"] = traceparent
        if not any(wanted) and len(items) == 1:
            return [_insert(reading, rows)[0]]  # one statement (and its rare retries): no transaction needed
        with transaction.atomic():
            outcomes = _insert(reading, rows)
            if any(wanted):
                outcomes = _link(reading, outcomes, ids, wanted, items, agent, batch)
            return outcomes


def _insert(reading: _Reading[_T], rows: list[dict[str, Any]]) -> list[tuple[_T, bool]]:
    """CREATE_MANY, then the holders of the keys of the items that did not insert. The holder of a key may
    finish between our conflicting INSERT and the read; those items are inserted again."""
    outcomes: dict[int, tuple[_T, bool]] = {}
    todo_at: Sequence[int] = range(len(rows))
    defaults = {
        "max_attempts": settings.QUEUE_DEFAULT_MAX_ATTEMPTS,
        "on_dependency_failure": OnDependencyFailure.CANCEL.value,
    }
    for _ in range(5):
        wanted = {rows[n]["id"]: n for n in todo_at}
        # One JSON text, cast to json by the statement (never jsonb: that would parse the batch twice).
        items = json.dumps([rows[n] for n in todo_at], separators=(",", ":"))
        for todo in reading.fetch(reading.insert, {"items": items, **defaults}):
            outcomes[wanted.pop(todo.id)] = (todo, True)
        if not wanted:
            break
        rest = list(wanted.values())
        keyed = [(rows[n]["queue"], rows[n].get("idempotency_key")) for n in rest]
        holders = {
            (t.queue, t.idempotency_key): t
            for t in reading.fetch(reading.holders, {"queues": [q for q, _ in keyed], "keys": [k for _, k in keyed]})
        }
        for n, key in zip(rest, keyed, strict=True):
            if (holder := holders.get(key)) is not None:
                outcomes[n] = (holder, False)
        todo_at = [n for n in rest if n not in outcomes]
        if not todo_at:
            break
    else:
        raise TodoConflict("The idempotency key is changing hands too fast; try again.", state="unknown")
    if len(outcomes) < len(rows):
        raise TodoConflict("The idempotency key is changing hands too fast; try again.", state="unknown")
    return [outcomes[n] for n in range(len(rows))]


def _link(
    reading: _Reading[_T],
    outcomes: list[tuple[_T, bool]],
    ids: list[str],
    wanted: list[list[str]],
    items: Sequence[Mapping[str, Any]],
    agent: Agent | None,
    batch: bool,
) -> list[tuple[_T, bool]]:
    """The edges of the items inserted with dependencies (LINK), then SETTLE for those already finished."""
    actual = {ids[n]: todo.id for n, (todo, _) in enumerate(outcomes)}  # an existing todo stands for its item
    dependents, positions, dependencies, repointed = [], [], [], []
    for n, (todo, created) in enumerate(outcomes):
        if not created or not wanted[n]:
            continue
        resolved = [actual.get(d, d) for d in wanted[n]]
        if resolved != wanted[n]:
            repointed.append((todo.id, resolved))
        for position, dependency in enumerate(resolved):
            dependents.append(todo.id)
            positions.append(position)
            dependencies.append(dependency)
    if not dependents:
        return outcomes
    if repointed:
        fetchall(
            sql.REPOINT,
            {"ids": [i for i, _ in repointed], "waiting_fors": [Jsonb({"todos": r}) for _, r in repointed]},
        )
    found = dict(
        fetchall(
            sql.LINK,
            {
                "dependents": dependents,
                "positions": positions,
                "dependencies": dependencies,
                "visible": _visible(agent),
            },
        )
    )
    for n, (_, created) in enumerate(outcomes):
        for given in items[n].get("depends_on") or () if created else ():
            if given not in found:
                where = f"todos.{n}.depends_on" if batch else "depends_on"
                raise TodoNotFound(f"No todo {given}.", fields={where: [f"No todo {given}."]})
    finished = [(i, outcome) for i, outcome in found.items() if outcome is not None]
    if finished:
        fetchall(sql.SETTLE, {"ids": [i for i, _ in finished], "outcomes": [o for _, o in finished]})
    elif not repointed:
        return outcomes
    # Settling moved some of the new todos on (pending, scheduled, cancelled), or they were repointed:
    # answer with them as they are.
    fresh = {t.id: t for t in reading.fetch(reading.by_id, {"ids": [t.id for t, created in outcomes if created]})}
    return [(fresh.get(todo.id, todo), created) for todo, created in outcomes]


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
    params = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [glob_to_like(q) for q in queues] if queues else ALL_QUEUES,
        "agent": agent.name,
        "owner": _owner(agent, worker),
        "limit": limit,
        "lease_seconds": _lease_seconds(lease_seconds),
    }
    todos = fetch_todos(sql.CLAIM_NEXT, params)
    if todos and todos[0].id is None:  # a keyed queue is among the caller's: it took nothing (fair share)
        todos = fetch_todos(sql.CLAIM_NEXT_FAIR, params)
    todos.sort(key=lambda t: (t.priority, t.run_at))  # UPDATE ... RETURNING keeps no order (CLAIM_ORDER)
    count_lapsed_claims(todos)
    selectors.attach_dependencies(todos)  # a merge step reads its dependencies' results from its claim
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
        selectors.attach_dependencies(rows)
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
    swept = [row[2] for row in fetchall(sql.REQUEUE_LAPSED, {"batch": batch})]  # (id, queue, state, ...)
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


# --- Waits (issue 20): todos/waitpoints.py parses what a wait is for; todos/sql/ has the statements. ---


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
    resolvers: Any = None,
) -> tuple[Todo, str | None]:
    """claimed -> waiting, giving the lease and the attempt back (as release), until what ``wait_for``
    names resolves it or ``timeout_seconds`` pass. Returns the todo and, for a token wait, the token (shown
    this once: only its hash is stored). Needs the current receipt. A wait on todos that have all finished
    resolves at once. ``resolvers``: who besides the token and operators may resolve it
    (todos/waitpoints.py); never the waiting agent. An event wait names a source the agent can see (else
    404 as for an unknown source), within MAX_OPEN_EVENT_WAITS_PER_AGENT (429)."""
    spec = waitpoints.parse_for(wait_for, waiter_id=todo_id)
    timeout, on_timeout = waitpoints.check_timeout(timeout_seconds, on_timeout)
    named = waitpoints.parse_resolvers(resolvers)
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
        "awaited": len(spec.todo_ids),
        "unlink": spec.kind != "todos",
        "resolver_agents": named.agents,
        "resolver_scopes": named.scope_likes,
    }
    if spec.kind == "event":
        return _wait_for_event(todo_id, agent, lease_id, spec.source or "", params), None
    if spec.kind != "todos":
        return _with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params), token
    # A wait on todos: its edges as a create's dependencies (todos/sql/dependencies.py), settled by the same
    # function; those already finished are settled once the todo waits (the last one resolves it at once).
    with transaction.atomic():
        found = dict(fetchall(sql.LINK_WAIT, {"id": todo_id, "ids": spec.todo_ids, "visible": _visible(agent)}))
        if missing := [i for i in spec.todo_ids if i not in found]:
            raise TodoNotFound(f"No todo {missing[0]} (named in for.todos).")
        todo = _with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params)
        finished = [(i, outcome) for i, outcome in found.items() if outcome is not None]
        if not finished:
            return todo, None
        fetchall(sql.SETTLE, {"ids": [i for i, _ in finished], "outcomes": [o for _, o in finished]})
        return fetch_todos(sql.TODOS_BY_ID, {"ids": [todo.id]})[0], None


def _wait_for_event(todo_id: str, agent: Agent, lease_id: str, source: str, params: dict[str, Any]) -> Todo:
    """An event wait, in one short transaction: the source must be one the agent may see events of (the rule
    of GET /api/v1/events/, asked through todos/event_sources.py), and the agent's open event waits must be
    below the cap. The transaction-scoped advisory lock on the agent's name makes its count and its insert
    one step, so concurrent waits of one agent cannot pass the cap together."""
    if not event_sources.visible_to(agent, source):
        # The same answer for a source that does not exist: slugs do not leak.
        raise TodoNotFound(f"No event source {source[:100]!r}.", fields={"for.event.source": ["No such source."]})
    cap = limits.max_open_event_waits_per_agent()
    with transaction.atomic():
        fetchall(sql.AGENT_LOCK, {"key": f"event-waits:{agent.name}"})
        ((open_waits,),) = fetchall(sql.OPEN_EVENT_WAITS, {"agent": agent.name, "cap": cap})
        if open_waits >= cap:
            raise TooManyWaits(
                f"This agent already has {cap} open event waits (MAX_OPEN_EVENT_WAITS_PER_AGENT).",
                limit="MAX_OPEN_EVENT_WAITS_PER_AGENT",
                max=cap,
            )
        return _with_receipt(sql.WAIT, "wait", todo_id, agent, lease_id, **params)


@counted("resolve")
@tracing.traced("resolve")
def resolve_token(token: str, *, data: JSON = None) -> Todo:
    """waiting -> pending, by the token of a ``{"token": true}`` wait; the token is the only credential.
    Resolves once: a second resolve is a conflict, an unknown token not found."""
    digest = hash_token(token)
    rows = fetch_todos(sql.RESOLVE_TOKEN, {"hash": digest, "data": Jsonb(data)})
    if rows:
        return rows[0]
    if not fetchall(sql.WAITPOINT_BY_HASH, {"hash": digest}):
        raise TodoNotFound("No waitpoint has this token.")
    # Without the todo's state: the token is the holder's only credential, and it is spent.
    raise WaitpointUsed("This waitpoint was resolved already (or its todo no longer waits).")


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
    """waiting -> pending, whatever it waits for, by someone the wait allows (issue 28): an operator
    (``agent`` None: an admin action, with ``verdict`` "approved" or "rejected" and a ``note``; or an agent
    with ``can_retry_dead_letters``, which staff get from Django's todos.change_todo), or an agent the wait
    names in its resolvers; never the agent that waits, and no other agent when it names none. ``by`` names
    who, and the resolution records it. Refused: NotAResolver (403), nothing changed."""
    detail: dict[str, Any] = {"data": data, "resolved_by": by}
    operator = agent is None or agent.can_retry_dead_letters
    if verdict is not None:
        if verdict not in ("approved", "rejected"):
            raise InvalidTransitionInput("verdict must be 'approved' or 'rejected'.", field="verdict")
        detail.update(verdict=verdict, note=note)
    rows = fetch_todos(
        sql.RESOLVE_MANUAL,
        {
            "id": todo_id,
            "visible": _visible(agent),
            "by": "operator" if operator else "agent",
            "detail": Jsonb(detail),
            "agent": agent.name if agent is not None else None,
            "operator": operator,
            "claim_scopes": list(agent.claim_scopes) if agent is not None else [],
        },
    )
    if rows:
        return rows[0]
    miss = _miss(todo_id, agent, "resolve")
    if isinstance(miss, TodoConflict) and miss.state == TodoState.WAITING and _has_open_wait(todo_id):
        raise NotAResolver("Only an operator or an agent this wait names in its resolvers may resolve it.")
    raise miss


def _has_open_wait(todo_id: str) -> bool:
    return Waitpoint.objects.filter(todo_id=todo_id, resolved_at__isnull=True).exists()


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
