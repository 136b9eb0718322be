"""Creating todos: one, or a batch all or nothing, with their dependencies (todos/sql/create.py,
todos/sql/dependencies.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg.types.json import Jsonb

from todos import notices, sql, tracing
from todos.errors import (
    InvalidTransitionInput,
    QueueError,
    TodoConflict,
    TodoNotFound,
)
from todos.flow import limit_names_problem
from todos.limits import (
    MAX_CREATE_BATCH,
    MAX_DELAY_SECONDS,
    MAX_FAIR_KEY_CHARS,
    MAX_QUEUE_LIMIT,
    notify_max_attempts,
)
from todos.metrics import TRANSITIONS, counted
from todos.models import (
    QUEUE_NAME_RE,
    SYSTEM_QUEUES,
    Agent,
    OnDependencyFailure,
    Todo,
    new_todo_id,
    new_webhook_secret,
    visible_patterns,
)
from todos.queue import lineage
from todos.queue._common import JSON, SUPERSEDED, priority_problem
from todos.queue.new_queues import admit_new_queues, new_queues_under_globs
from todos.queue.trees import CHILDREN_POLICIES
from todos.rows import fetch_todos, fetchall, todo_from_row
from todos.usage import counters

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
    "spawn_caps",
    "children",
    "budget",
    "callback",
    "limits",
    "expires_at",
    "expire_after_seconds",
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
    parent: Mapping[str, str] | None = None,
    spawn_caps: Mapping[str, int] | None = None,
    children: str = "keep",
    budget: Mapping[str, float] | None = None,
    callback: Mapping[str, Any] | None = None,
    limits: Sequence[str] | None = None,
    supersede: bool = False,
    debounce_seconds: float | None = None,
    expires_at: datetime | None = None,
    expire_after_seconds: float | None = None,
) -> tuple[Todo, bool]:
    """-> pending, or -> scheduled when ``run_at`` (or now + ``delay_seconds``; not both) is in the future,
    or -> waiting while any of ``depends_on`` (todo ids the creator can see) is unfinished. Idempotent: if a
    runnable todo (scheduled and waiting ones included) holds (queue, idempotency_key), return it and False.
    ``priority`` orders claims, lower first. ``on_dependency_failure``: what a dependency that dead-letters
    or is cancelled does to this todo: ``cancel`` it (its history names the dependency), or ``run`` it anyway.

    ``agent`` None is the system (webhook routing, schedules); an agent may create only in its create scopes.
    ``fair_key``: the tenant a fair queue shares its claims by (todos/sql/claim.py, CLAIM_NEXT_FAIR).
    ``parent``: ``{"id", "lease_id"}``, the receipt of a todo the agent holds: the new todo is its child
    (parent_id, root_id, depth), within its tree's spawn caps (ParentNotHeld, SpawnLimitReached).
    ``spawn_caps``: a root's own caps ({max_depth, max_children, max_descendants}, each optional), tighter
    than its queue's (the smaller of the two holds); not with ``parent``.
    ``children``: "cancel" makes its finish cancel what is left under it (todos/queue/trees.py); "keep" not.
    ``budget``: a root's {counter: limit}: once its tree's usage reaches one, claims skip the tree; not with
    ``parent``.
    ``callback``: ``{"url", "events"}`` (events: ``done`` and/or ``dead_lettered``, default both): when the todo
    gets there, a signed webhook of ``todo.done`` / ``todo.dead_lettered`` with the todo's JSON goes to the
    URL (todos/notices.py), signed with the creating agent's webhook_secret. The URL passes the SSRF guard
    (400 naming ``callback.url``).
    ``limits``: names of limits (issue 31, todos/flow.py) the todo is held by, beside its queue's.
    ``supersede`` (issue 31): cancel the runnable todo holding ``idempotency_key`` (reason ``superseded``; a
    claimed one's holder gets 409 superseded on its next step) and create this one, in one transaction.
    ``expires_at`` or ``expire_after_seconds`` (issue 31): a start-by deadline; not claimed by then, the todo
    is cancelled with reason ``expired``.
    ``debounce_seconds`` N: one todo per key, running N seconds after the last create (a pending or scheduled
    holder's run_at moves to now + N and it is returned, not created).
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
        "spawn_caps": spawn_caps,
        "children": children,
        "budget": budget,
        "callback": callback,
        "limits": limits,
        "expires_at": expires_at,
        "expire_after_seconds": expire_after_seconds,
    }
    if supersede or debounce_seconds is not None:
        return _create_by_key(item, agent, parent, supersede=supersede, debounce_seconds=debounce_seconds)
    return _create_many([item], agent, _WHOLE, batch=False, parent=parent)[0]


def _create_by_key(
    item: dict[str, Any],
    agent: Agent | None,
    parent: Mapping[str, str] | None,
    *,
    supersede: bool,
    debounce_seconds: float | None,
) -> tuple[Todo, bool]:
    """create with supersede or debounce_seconds (issue 31, todos/sql/flow.py SUPERSEDE and DEBOUNCE)."""
    if not isinstance(supersede, bool):
        raise InvalidTransitionInput("supersede must be true or false.", field="supersede")
    if supersede and debounce_seconds is not None:
        raise InvalidTransitionInput("Give supersede or debounce_seconds, not both.", field="debounce_seconds")
    field = "supersede" if supersede else "debounce_seconds"
    if not item.get("idempotency_key"):
        raise InvalidTransitionInput(f"{field} needs an idempotency_key: the key it acts by.", field=field)
    if debounce_seconds is not None:
        if (
            isinstance(debounce_seconds, bool)
            or not isinstance(debounce_seconds, int | float)
            or not 0 <= debounce_seconds <= MAX_DELAY_SECONDS
        ):
            raise InvalidTransitionInput(
                f"debounce_seconds must be between 0 and {MAX_DELAY_SECONDS}.", field="debounce_seconds"
            )
        if item.get("run_at") is not None or item.get("delay_seconds") is not None:
            raise InvalidTransitionInput(
                "debounce_seconds sets when it runs: not with run_at or delay_seconds.", field="debounce_seconds"
            )
    _check_item(item, agent, None, {})  # before the supersede: a bad create changes nothing
    key = {"queue": item["queue"], "key": item["idempotency_key"], "visible": visible_patterns(agent)}
    with transaction.atomic():
        if supersede:
            fetch_todos(sql.SUPERSEDE, {**key, "operator": agent.name if agent else "system", "reason": SUPERSEDED})
            return _create_many([item], agent, _WHOLE, batch=False, parent=parent)[0]
        moved = fetch_todos(sql.DEBOUNCE, {**key, "seconds": float(debounce_seconds or 0)})
        if moved:
            return moved[0], False
        todo, created = _create_many(
            [{**item, "delay_seconds": float(debounce_seconds or 0)}], agent, _WHOLE, batch=False, parent=parent
        )[0]
        if not created and (moved := fetch_todos(sql.DEBOUNCE, {**key, "seconds": float(debounce_seconds or 0)})):
            return moved[0], False  # a concurrent create made it first: moved all the same
        return todo, created


def create_many(
    items: Sequence[Mapping[str, Any]], *, agent: Agent | None = None, parent: Mapping[str, str] | None = None
) -> list[tuple[TodoRef, bool]]:
    """create for a batch (up to MAX_CREATE_BATCH items, each a dict of create's arguments, plus
    ``depends_on_index``: earlier items of the batch it depends on), all or nothing: one (todo's id and
    state, created) per item, in order, or an error naming the item (``todos.<index>.<field>``) and nothing
    written. ``parent``: as create's, for every item (a fan-out: one parent, many children)."""
    try:
        outcomes = _create_many(items, agent, _BRIEF, batch=True, parent=parent)
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
    spawn: str  # insert under a parent (sql.SPAWN): its rows carry the verdict first
    from_row: Callable[[tuple[Any, ...]], _T]


def _fetch_refs(statement: str, params: dict[str, Any]) -> list[TodoRef]:
    return [TodoRef._make(row) for row in fetchall(statement, params)]


def _todo_from_row(row: tuple[Any, ...]) -> Todo:
    return todo_from_row(row, connections[DEFAULT_DB_ALIAS])


_WHOLE = _Reading(sql.CREATE_MANY, sql.RUNNABLE_BY_KEYS, sql.TODOS_BY_ID, fetch_todos, sql.SPAWN, _todo_from_row)
_BRIEF = _Reading(
    sql.CREATE_MANY_BRIEF, sql.RUNNABLE_BY_KEYS_BRIEF, sql.REFS_BY_ID, _fetch_refs, sql.SPAWN_BRIEF, TodoRef._make
)
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
    if not isinstance(queue, str) or not (QUEUE_NAME_RE.match(queue) or (agent is None and queue in SYSTEM_QUEUES)):
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
    if problem := priority_problem(item.get("priority", 0)):
        raise _invalid(problem, "priority", index)
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
    if (caps := item.get("spawn_caps")) is not None and (
        not isinstance(caps, Mapping)
        or not caps.keys() <= _SPAWN_CAPS
        or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_QUEUE_LIMIT for v in caps.values())
    ):
        raise _invalid(
            f"spawn_caps takes max_depth, max_children and max_descendants, each 0 to {MAX_QUEUE_LIMIT}.",
            "spawn_caps",
            index,
        )
    if item.get("children", "keep") not in CHILDREN_POLICIES:
        raise _invalid("children must be 'keep' or 'cancel'.", "children", index)
    counters(item.get("budget"), "budget", positive=True, index=index)
    if (callback := item.get("callback")) is not None:
        _check_callback(callback, agent, index)
    if (problem := limit_names_problem(item.get("limits"))) is not None:
        raise _invalid(problem, "limits", index)
    expires_at, expire_after = item.get("expires_at"), item.get("expire_after_seconds")
    if expires_at is not None and expire_after is not None:
        raise _invalid("Give expires_at or expire_after_seconds, not both.", "expires_at", index)
    if expires_at is not None and (not isinstance(expires_at, datetime) or expires_at.tzinfo is None):
        raise _invalid("expires_at needs a time zone offset (RFC 3339).", "expires_at", index)
    if expire_after is not None and (
        isinstance(expire_after, bool)
        or not isinstance(expire_after, int | float)
        or not 0 < expire_after <= MAX_DELAY_SECONDS
    ):
        raise _invalid(
            f"expire_after_seconds must be above 0 and at most {MAX_DELAY_SECONDS}.", "expire_after_seconds", index
        )
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


_CALLBACK_EVENTS = ("done", "dead_lettered")


def _check_callback(callback: Any, agent: Agent | None, index: int | None) -> None:
    if not isinstance(callback, Mapping) or not callback.keys() <= {"url", "events"} or "url" not in callback:
        raise _invalid('callback is {"url": ..., "events": ["done", "dead_lettered"]}.', "callback", index)
    events = callback.get("events", _CALLBACK_EVENTS)
    if not isinstance(events, list | tuple) or not events or not set(events) <= set(_CALLBACK_EVENTS):
        raise _invalid("callback.events lists done and/or dead_lettered.", "callback.events", index)
    if agent is None or agent.pk is None:
        raise _invalid(
            "A callback is signed with its creating agent's secret: create it with an agent token.", "callback", index
        )
    try:
        notices.check_outbound_url(callback["url"], field="callback.url")
    except InvalidTransitionInput as exc:
        raise _invalid(exc.detail, "callback.url", index) from exc


def _callback_row(callback: Mapping[str, Any], agent: Agent) -> dict[str, Any]:
    """What the todo stores of its callback: what the trigger and the sender need (todos/notices.py)."""
    if not agent.webhook_secret:  # the agent's first callback: give it its secret (create_agent shows it)
        agent.webhook_secret = new_webhook_secret()
        Agent.objects.filter(pk=agent.pk, webhook_secret__isnull=True).update(webhook_secret=agent.webhook_secret)
    events = [e for e in _CALLBACK_EVENTS if e in callback.get("events", _CALLBACK_EVENTS)]
    return {"url": callback["url"], "events": events, "agent": agent.name, "max_attempts": notify_max_attempts()}


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
    if item.get("children") == "cancel":  # "keep" is NULL: a plain create writes nothing more
        row["children"] = "cancel"
    if names := item.get("limits"):  # NULL for none: a plain create writes nothing more
        row["limits"] = sorted(set(names))
    if (expires_at := item.get("expires_at")) is not None:
        row["expires_at"] = expires_at.isoformat()
    if (expire_after := item.get("expire_after_seconds")) is not None:
        row["expire_after"] = expire_after
    return row


_DEFAULTED = ("source", "kind", "title", "fair_key", "max_attempts", "priority", "on_dependency_failure")
_NULLABLE = ("payload", "event_id", "idempotency_key", "assignee", "spawn_caps", "budget")
_SPAWN_CAPS = frozenset(("max_depth", "max_children", "max_descendants"))


def _dependencies(item: Mapping[str, Any], ids: list[str]) -> list[str]:
    given, earlier = item.get("depends_on"), item.get("depends_on_index")
    if not given and not earlier:
        return []
    return list(dict.fromkeys([*(given or ()), *(ids[j] for j in earlier or ())]))


def _create_many(
    items: Sequence[Mapping[str, Any]],
    agent: Agent | None,
    reading: _Reading[_T],
    *,
    batch: bool,
    parent: Mapping[str, str] | None = None,
) -> list[tuple[_T, bool]]:
    if not items:
        return []
    if parent is not None and agent is None:
        raise InvalidTransitionInput("Only an agent holding the parent's lease may name a parent.", field="parent")
    if parent is not None and any(item.get("spawn_caps") is not None for item in items):
        raise InvalidTransitionInput("spawn_caps are a root's: a child takes its tree's.", field="spawn_caps")
    if parent is not None and any(item.get("budget") is not None for item in items):
        raise InvalidTransitionInput("A budget is a root's: a child spends its tree's.", field="budget")
    if len(items) > MAX_CREATE_BATCH:
        raise InvalidTransitionInput(f"At most {MAX_CREATE_BATCH} todos a batch.", field="todos")
    allowed: dict[str, bool] = {}
    for index, item in enumerate(items):
        _check_item(item, agent, index if batch else None, allowed)
    new_queues = new_queues_under_globs(agent, allowed) if agent is not None else {}
    ids = [new_todo_id() for _ in items]
    # Each item's dependencies, in the order given (duplicates dropped): ids, then earlier items (by the id
    # generated for them: an item that turns out to exist already is repointed below).
    wanted = [_dependencies(item, ids) for item in items]
    targets = {j for item in items for j in item.get("depends_on_index") or ()}
    rows = [_item_row(item, ids[n], wanted[n], n in targets) for n, item in enumerate(items)]
    for row, item in zip(rows, items, strict=True):
        if (callback := item.get("callback")) is not None:
            assert agent is not None
            row["callback"] = _callback_row(callback, agent)
    with tracing.creating_many([(i.get("traceparent"), i["queue"]) for i in items]) as traceparents:
        for row, traceparent in zip(rows, traceparents, strict=True):
            if traceparent is not None:
                row["traceparent"] = traceparent
        if not any(wanted) and len(items) == 1 and not new_queues and parent is None:
            return [_insert(reading, rows)[0]]  # one statement (and its rare retries): no transaction needed
        spawning = None
        if parent is not None:
            assert agent is not None
            spawning = lineage.spawning(parent, agent, len(items))
            # One item: one statement too (receipt, caps and insert), as a plain create; a batch keeps its
            # transaction (a retried key's second statement must not follow a first one already committed).
            if not any(wanted) and len(items) == 1 and not new_queues:
                try:
                    return _insert(reading, rows, spawning)
                except lineage.Stale:
                    pass  # a create of the same tree came in between: again, with its root locked first
        with transaction.atomic():
            if spawning is not None:
                lineage.lock_root(spawning)
            if new_queues:
                admit_new_queues(new_queues, items, batch)
            try:
                outcomes = _insert(reading, rows, spawning)
            except lineage.Stale:  # never with the root locked first; refused rather than left unhandled
                raise TodoConflict("The tree is changing too fast; try again.", state="unknown") from None
            if any(wanted):
                outcomes = _link(reading, outcomes, ids, wanted, items, agent, batch)
            return outcomes


def _insert(
    reading: _Reading[_T], rows: list[dict[str, Any]], spawning: dict[str, Any] | None = None
) -> list[tuple[_T, bool]]:
    """CREATE_MANY (SPAWN under a parent: ``spawning``, its parameters), then the holders of the keys of the
    items that did not insert. The holder of a key may finish between our conflicting INSERT and the read;
    those items are inserted again."""
    outcomes: dict[int, tuple[_T, bool]] = {}
    todo_at: Sequence[int] = range(len(rows))
    defaults = {
        "max_attempts": settings.QUEUE_DEFAULT_MAX_ATTEMPTS,
        "on_dependency_failure": OnDependencyFailure.CANCEL.value,
    }
    for attempt in range(5):
        wanted = {rows[n]["id"]: n for n in todo_at}
        # One JSON text, cast to json by the statement (never jsonb: that would parse the batch twice).
        items = json.dumps([rows[n] for n in todo_at], separators=(",", ":"))
        if spawning is None:
            made = reading.fetch(reading.insert, {"items": items, **defaults})
        else:
            answer = fetchall(reading.spawn, {"items": items, **defaults, **spawning, "n": len(todo_at)})
            try:
                made = [reading.from_row(row) for row in lineage.inserted(answer, spawning["id"])]
            except lineage.Stale:
                if attempt == 0:
                    raise  # nothing written yet: the caller runs it all again with the root locked
                raise TodoConflict("The tree is changing too fast; try again.", state="unknown") from None
        for todo in made:
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
                "visible": visible_patterns(agent),
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
