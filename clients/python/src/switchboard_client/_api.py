"""Every REST verb, once: each builder turns its arguments into a ``Call`` (method, path, body, how to
read the answer, whether a retry is safe). ``Client`` and ``AsyncClient`` only send Calls, so the two
cannot drift, and the contract test (tests/test_client_contract.py) reads ``OPERATIONS`` to compare each
builder's parameters with the server's OpenAPI operation of the same id."""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from switchboard_client.models import (
    JSON,
    AgentExplanation,
    BatchOutcome,
    CreatedTodo,
    CreateOutcome,
    Event,
    EventSummary,
    Explanation,
    Limit,
    Page,
    QueueControls,
    QueueStats,
    Replay,
    Resolved,
    Schedule,
    Todo,
    TreePage,
    WaitingTodo,
)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Retry(enum.Enum):
    """When resending is safe. Every level resends a request that never reached the server (the
    connection could not be opened)."""

    #: Also after a 503 or a broken connection: the verb is idempotent (reads, heartbeat, pause...).
    IDEMPOTENT = "idempotent"
    #: Also after a 503, whose transaction rolled back; not after a connection broke mid-request, when
    #: the server may have acted (a claim's todos would come back only when their lease lapses).
    ON_UNAVAILABLE = "on_unavailable"
    #: Never resent once it may have reached the server: a create without an idempotency key.
    UNSENT_ONLY = "unsent_only"


class _Unset(enum.Enum):
    UNSET = "unset"


#: "Leave this as it is" where None means "remove" (a queue's limits).
UNSET = _Unset.UNSET
NO_BODY: Any = object()


@dataclass(frozen=True)
class Call(Generic[T]):
    op: str
    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = NO_BODY
    params: Mapping[str, Any] = field(default_factory=dict)
    retry: Retry = Retry.IDEMPOTENT
    #: Extra seconds the answer may take beyond the client's timeout (a long-poll's wait).
    wait: float = 0.0


OPERATIONS: dict[str, Callable[..., Call[Any]]] = {}


def operation(op: str) -> Callable[[F], F]:
    def register(builder: F) -> F:
        OPERATIONS[op] = builder
        builder.operation_id = op  # type: ignore[attr-defined]
        return builder

    return register


def _park(park: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if park is None:
        return None
    until = park.get("until")
    return {**park, "until": until.isoformat() if isinstance(until, datetime) else until}


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _queue_path(name: str) -> str:
    # Queue names may hold "/" (the server routes <path:name>): keep it, quote the rest.
    return urllib.parse.quote(name, safe="/")


def _id(todo: Todo | str) -> str:
    return todo.id if isinstance(todo, Todo) else todo


def _receipt(todo: Todo | str, lease_id: str | None) -> tuple[str, str]:
    if lease_id is None:
        if not isinstance(todo, Todo) or todo.lease_id is None:
            raise TypeError("a lease_id is needed (or pass the claimed Todo)")
        lease_id = todo.lease_id
    return _id(todo), lease_id


def _given(**values: Any) -> dict[str, Any]:
    """The fields the caller gave: None means "the server's default"."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in values.items() if v is not None}


def _parent(parent: Todo | Mapping[str, str] | None) -> dict[str, str] | None:
    """A parent's receipt: a claimed Todo's id and lease_id, or the mapping as given."""
    if parent is None:
        return None
    if isinstance(parent, Todo):
        return {"id": parent.id, "lease_id": str(parent.lease_id)}
    return {"id": parent["id"], "lease_id": parent["lease_id"]}


def _cursor(url: str | None) -> str | None:
    if not url:
        return None
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("cursor")
    return values[0] if values else None


def _page(model: Callable[[dict[str, JSON]], T]) -> Callable[[Any], Page[T]]:
    def parse(data: Any) -> Page[T]:
        return Page([model(item) for item in data["results"]], _cursor(data.get("next")), _cursor(data.get("previous")))

    return parse


def _todo(data: Any) -> Todo:
    return Todo.from_json(data)


# --- todos ------------------------------------------------------------------------------------------


@operation("todos_create")
def create(
    queue: str,
    *,
    kind: str | None = None,
    title: str | None = None,
    payload: JSON = None,
    source: str | None = None,
    idempotency_key: str | None = None,
    assignee: str | None = None,
    max_attempts: int | None = None,
    run_at: datetime | str | None = None,
    delay_seconds: float | None = None,
    priority: int | None = None,
    traceparent: str | None = None,
    depends_on: Iterable[Todo | str] | None = None,
    on_dependency_failure: str | None = None,
    fair_key: str | None = None,
    parent: Todo | Mapping[str, str] | None = None,
    spawn_caps: Mapping[str, int] | None = None,
    callback: Mapping[str, Any] | None = None,
    children: str | None = None,
    budget: Mapping[str, float] | None = None,
    limits: Iterable[str] | None = None,
    expires_at: datetime | str | None = None,
    expire_after_seconds: float | None = None,
    supersede: bool | None = None,
    debounce_seconds: float | None = None,
) -> Call[CreatedTodo]:
    """``parent``: a todo you hold (the claimed Todo, or {"id", "lease_id"}): the new todo is its child.
    ``spawn_caps``: a root's own caps (max_depth, max_children, max_descendants), tighter than its queue's.
    ``callback``: {"url", "events"}: a signed webhook (todo.done / todo.dead_lettered) when it gets there,
    signed with your agent's webhook_secret.
    ``limits``: named limits it is held by. ``expires_at`` / ``expire_after_seconds``: a start-by deadline.
    ``supersede``: replace the runnable todo holding ``idempotency_key``; ``debounce_seconds``: one todo per key,
    run that long after the last create. ``children``: "cancel" makes its finish cancel what is left
    under it. ``budget``: a root's {counter: limit}: once its tree's usage reaches one, claims skip the tree."""
    body = _given(
        queue=queue,
        kind=kind,
        title=title,
        payload=payload,
        source=source,
        idempotency_key=idempotency_key,
        assignee=assignee,
        max_attempts=max_attempts,
        run_at=run_at,
        delay_seconds=delay_seconds,
        priority=priority,
        traceparent=traceparent,
        depends_on=[_id(t) for t in depends_on] if depends_on is not None else None,
        on_dependency_failure=on_dependency_failure,
        fair_key=fair_key,
        parent=_parent(parent),
        spawn_caps=dict(spawn_caps) if spawn_caps is not None else None,
        children=children,
        budget=dict(budget) if budget is not None else None,
        callback=dict(callback) if callback is not None else None,
        limits=list(limits) if limits is not None else None,
        expires_at=expires_at,
        expire_after_seconds=expire_after_seconds,
        supersede=supersede,
        debounce_seconds=debounce_seconds,
    )
    retry = Retry.ON_UNAVAILABLE if idempotency_key else Retry.UNSENT_ONLY
    return Call("todos_create", "POST", "todos/", CreatedTodo.from_json, body, retry=retry)


@operation("todos_create_many")
def create_many(
    todos: Iterable[Mapping[str, Any]], *, parent: Todo | Mapping[str, str] | None = None
) -> Call[list[CreateOutcome]]:
    """Up to 1,000 creates in one transaction, each a mapping of ``create``'s arguments (``queue`` and the
    keywords) plus ``depends_on`` (todo ids) or ``depends_on_index`` (earlier items of this batch), and
    ``on_dependency_failure``. All or nothing: an invalid item raises Invalid naming ``todos.<i>.<field>``.
    ``parent``: as create's, for every item."""
    items = [_given(**item) for item in todos]
    # Resent after a 503 (the transaction rolled back) only when every item has an idempotency key.
    keyed = all(item.get("idempotency_key") for item in items)
    return Call(
        "todos_create_many",
        "POST",
        "todos/batch/",
        lambda data: [CreateOutcome.from_json(o) for o in data["outcomes"]],
        {"todos": items, **_given(parent=_parent(parent))},
        retry=Retry.ON_UNAVAILABLE if keyed else Retry.UNSENT_ONLY,
    )


@operation("todos_retrieve")
def get(todo: Todo | str, *, wait_seconds: float | None = None) -> Call[Todo]:
    """With ``wait_seconds`` (up to 20), await the result: the answer comes when the todo is finished or
    the time runs out, with the todo as it then is."""
    params = _given(wait_seconds=wait_seconds)
    return Call("todos_retrieve", "GET", f"todos/{_q(_id(todo))}/", _todo, params=params, wait=wait_seconds or 0.0)


@operation("todos_list")
def list_todos(
    *,
    queue: str | None = None,
    state: str | None = None,
    kind: str | None = None,
    assignee: str | None = None,
    dead: bool | None = None,
    fair_key: str | None = None,
    root: Todo | str | None = None,
    page_size: int | None = None,
    cursor: str | None = None,
) -> Call[Page[Todo]]:
    """``root``: a tree's todos (the root and its descendants)."""
    params = _given(
        queue=queue,
        state=state,
        kind=kind,
        assignee=assignee,
        fair_key=fair_key,
        root=_id(root) if root is not None else None,
        page_size=page_size,
        cursor=cursor,
    )
    if dead is not None:
        params["dead"] = "true" if dead else "false"
    return Call("todos_list", "GET", "todos/", _page(Todo.from_json), params=params)


@operation("todos_tree")
def tree(todo: Todo | str, *, cursor: str | None = None) -> Call[TreePage]:
    """A page of the todo's tree: itself, then its descendants by depth (``cursor``: a page's next_cursor)."""
    return Call("todos_tree", "GET", f"todos/{_q(_id(todo))}/tree/", TreePage.from_json, params=_given(cursor=cursor))


@operation("todos_partial_update")
def set_priority(todo: Todo | str, priority: int) -> Call[Todo]:
    return Call("todos_partial_update", "PATCH", f"todos/{_q(_id(todo))}/", _todo, {"priority": priority})


@operation("todos_run_now")
def run_now(todo: Todo | str) -> Call[Todo]:
    return Call("todos_run_now", "POST", f"todos/{_q(_id(todo))}/run-now/", _todo, retry=Retry.ON_UNAVAILABLE)


@operation("todos_claim_next")
def claim(
    queues: Iterable[str] | None = None,
    *,
    limit: int | None = None,
    lease_seconds: float | None = None,
    wait_seconds: float | None = None,
    worker: str | None = None,
) -> Call[list[Todo]]:
    body = _given(
        queues=list(queues) if queues else None,
        limit=limit,
        lease_seconds=lease_seconds,
        wait_seconds=wait_seconds,
        worker=worker,
    )
    return Call(
        "todos_claim_next",
        "POST",
        "todos/claim/",
        lambda data: [Todo.from_json(t) for t in data["todos"]],
        body,
        retry=Retry.ON_UNAVAILABLE,
        wait=wait_seconds or 0.0,
    )


@operation("todos_claim")
def claim_one(todo: Todo | str, *, lease_seconds: float | None = None, worker: str | None = None) -> Call[Todo]:
    body = _given(lease_seconds=lease_seconds, worker=worker)
    return Call("todos_claim", "POST", f"todos/{_q(_id(todo))}/claim/", _todo, body, retry=Retry.ON_UNAVAILABLE)


@operation("todos_heartbeat")
def heartbeat(
    todo: Todo | str,
    lease_id: str | None = None,
    *,
    lease_seconds: float | None = None,
    progress: Mapping[str, JSON] | None = None,
    checkpoint: JSON = None,
    usage: Mapping[str, float] | None = None,
) -> Call[Todo]:
    """``progress``: {"percent": 0-100, "message": ...}; ``checkpoint``: a JSON object (at most 64 KB)
    the next claimer gets if this attempt ends; ``usage``: what the attempt used since its last report
    ({tokens_in, cost_usd, ...}), added to the todo's and its tree's. The answer's ``budget_exhausted``
    (in ``Todo.extra``) says its tree has spent its budget: stop."""
    todo_id, lease = _receipt(todo, lease_id)
    body = _given(
        lease_id=lease,
        lease_seconds=lease_seconds,
        progress=dict(progress) if progress is not None else None,
        checkpoint=checkpoint,
        usage=dict(usage) if usage is not None else None,
    )
    return Call("todos_heartbeat", "POST", f"todos/{_q(todo_id)}/heartbeat/", _todo, body)


@operation("todos_complete")
def complete(
    todo: Todo | str, lease_id: str | None = None, *, result: JSON = None, usage: Mapping[str, float] | None = None
) -> Call[Todo]:
    """``usage``: as heartbeat's, the last of it. A todo cancelled meanwhile keeps ``result`` as its
    late_result and answers Conflict (state cancelled)."""
    todo_id, lease = _receipt(todo, lease_id)
    body = {"lease_id": lease, "result": result, **_given(usage=dict(usage) if usage is not None else None)}
    return Call("todos_complete", "POST", f"todos/{_q(todo_id)}/complete/", _todo, body, retry=Retry.ON_UNAVAILABLE)


@operation("todos_complete_many")
def complete_many(items: Iterable[tuple[Todo | str, str | None, JSON]]) -> Call[list[BatchOutcome]]:
    """``items``: (todo or id, lease_id or None for the Todo's own, result), at most 100."""
    body = [{"id": i, "lease_id": lease, "result": result} for i, lease, result in _items(items)]
    return Call(
        "todos_complete_many",
        "POST",
        "todos/complete/",
        lambda data: [BatchOutcome.from_json(o) for o in data["outcomes"]],
        {"items": body},
        # Resending is harmless: an item the first send completed answers 409 (done) the second time.
        retry=Retry.IDEMPOTENT,
    )


def _items(items: Iterable[tuple[Todo | str, str | None, JSON]]) -> list[tuple[str, str, JSON]]:
    return [(*_receipt(todo, lease), result) for todo, lease, result in items]


@operation("todos_fail")
def fail(
    todo: Todo | str,
    lease_id: str | None = None,
    *,
    error: str = "",
    retry_in_seconds: float | None = None,
    park: Mapping[str, Any] | None = None,
) -> Call[Todo]:
    """``park``: {"limit", "until", "reason"} on a quota wall: the todo is given back (no attempt spent) and the
    named limit it names is parked until ``until``."""
    todo_id, lease = _receipt(todo, lease_id)
    body = _given(lease_id=lease, error=error, retry_in_seconds=retry_in_seconds, park=_park(park))
    return Call("todos_fail", "POST", f"todos/{_q(todo_id)}/fail/", _todo, body, retry=Retry.ON_UNAVAILABLE)


@operation("todos_release")
def release(todo: Todo | str, lease_id: str | None = None, *, park: Mapping[str, Any] | None = None) -> Call[Todo]:
    """``park``: as fail's."""
    todo_id, lease = _receipt(todo, lease_id)
    body = _given(lease_id=lease, park=_park(park))
    return Call("todos_release", "POST", f"todos/{_q(todo_id)}/release/", _todo, body, retry=Retry.ON_UNAVAILABLE)


@operation("todos_retry")
def retry(todo: Todo | str, *, mode: str = "reset", note: str | None = None) -> Call[Todo]:
    body = _given(mode=mode, note=note)
    return Call("todos_retry", "POST", f"todos/{_q(_id(todo))}/retry/", _todo, body, retry=Retry.ON_UNAVAILABLE)


@operation("todos_wait")
def wait(
    todo: Todo | str,
    lease_id: str | None = None,
    *,
    timeout_seconds: float,
    todos: Iterable[Todo | str] | None = None,
    event: Mapping[str, JSON] | None = None,
    token: bool = False,
    people: Mapping[str, JSON] | None = None,
    on_timeout: str | None = None,
    resolvers: Iterable[str] | None = None,
) -> Call[WaitingTodo]:
    """Give the lease back and wait (state ``waiting``) for exactly one of: ``todos`` all finished,
    an ``event`` ({"source", "type" glob, "match": {"dotted.path": value}}; a source routed into the agent's
    scopes), a ``token`` resolve (the answer's ``waitpoint``, shown this once), or ``people``' decision
    ({"users", "groups", "title", "body", "decisions", "edit_schema", "arguments", "remind_after_seconds",
    "escalate_after_seconds", "escalate_to"}: the next claim's ``resolution`` is {"by": "person",
    "decision", "edited", "text", "decided_by", "at"}). After
    ``timeout_seconds``: pending with ``resolution["timed_out"]``, or a failure with ``on_timeout="fail"``.
    ``resolvers``: agent names or ``scope:<glob>`` that may also resolve it (``resolve``); never this agent,
    and with none named only an operator may."""
    kinds = {"todos": todos is not None, "event": event is not None, "token": token, "people": people is not None}
    if sum(kinds.values()) != 1:
        raise TypeError("wait for exactly one of todos=, event=, token=True or people=")
    todo_id, lease = _receipt(todo, lease_id)
    waiting_for: dict[str, JSON]
    if todos is not None:
        waiting_for = {"todos": [_id(t) for t in todos]}
    elif event is not None:
        waiting_for = {"event": dict(event)}
    elif people is not None:
        waiting_for = {"people": dict(people)}
    else:
        waiting_for = {"token": True}
    body = _given(lease_id=lease, timeout_seconds=timeout_seconds, on_timeout=on_timeout)
    body["for"] = waiting_for
    if resolvers is not None:
        body["resolvers"] = list(resolvers)
    # A 503 rolled back; a resend after a broken connection may find the todo already waiting (409).
    return Call(
        "todos_wait",
        "POST",
        f"todos/{_q(todo_id)}/wait/",
        WaitingTodo.from_json,
        body,
        retry=Retry.ON_UNAVAILABLE,
    )


@operation("todos_resolve")
def resolve(todo: Todo | str, *, data: JSON = None) -> Call[Todo]:
    """End a waiting todo's wait now: an operator, or an agent the wait names in its ``resolvers`` (never
    the waiting agent: 403). Pending, ``resolution`` {by: "agent" or "operator", data, resolved_by}."""
    return Call(
        "todos_resolve",
        "POST",
        f"todos/{_q(_id(todo))}/resolve/",
        _todo,
        {"data": data},
        retry=Retry.ON_UNAVAILABLE,
    )


@operation("waitpoints_resolve")
def resolve_waitpoint(token: str, *, data: JSON = None) -> Call[Resolved]:
    """Resolve a token wait by its token (the only credential it needs): once only, a second is 409. The
    token travels in the body, never in the URL (which access logs keep)."""
    return Call(
        "waitpoints_resolve",
        "POST",
        "waitpoints/resolve/",
        Resolved.from_json,
        {"token": token, "data": data},
        retry=Retry.ON_UNAVAILABLE,
    )


@operation("todos_cancel")
def cancel(todo: Todo | str, *, reason: str | None = None, cascade: bool | None = None) -> Call[Todo]:
    """``cascade``: its unfinished descendants too (those in your scopes), in the same transaction."""
    body = _given(reason=reason, cascade=cascade)
    return Call("todos_cancel", "POST", f"todos/{_q(_id(todo))}/cancel/", _todo, body, retry=Retry.ON_UNAVAILABLE)


@operation("todos_budget")
def set_budget(todo: Todo | str, budget: Mapping[str, float]) -> Call[Todo]:
    """A root's budget (an operator: --can-manage), replacing its old one; raising it unblocks its tree."""
    return Call("todos_budget", "PATCH", f"todos/{_q(_id(todo))}/budget/", _todo, {"budget": dict(budget)})


@operation("todos_explain")
def explain(todo: Todo | str) -> Call[Explanation]:
    """Every reason a claim by you would not take the todo now, in order."""
    return Call("todos_explain", "GET", f"todos/{_q(_id(todo))}/explain/", Explanation.from_json)


@operation("agents_me_explain")
def explain_claims(queues: Iterable[str] | None = None) -> Call[AgentExplanation]:
    """Why a claim by you (of ``queues``: names or globs; default all your scopes) gets nothing now."""
    params = _given(queues=",".join(queues) if queues is not None else None)
    return Call("agents_me_explain", "GET", "agents/me/explain/", AgentExplanation.from_json, params=params)


# --- queues and schedules ------------------------------------------------------------------------------


@operation("queues_list")
def queues() -> Call[list[QueueStats]]:
    return Call("queues_list", "GET", "queues/", lambda data: [QueueStats.from_json(q) for q in data["queues"]])


@operation("queues_retrieve")
def queue(name: str) -> Call[QueueControls]:
    return Call("queues_retrieve", "GET", f"queues/{_queue_path(name)}/", QueueControls.from_json)


@operation("queues_limit")
def set_limits(
    name: str,
    *,
    max_claimed: int | _Unset | None = UNSET,
    rate_per_second: float | _Unset | None = UNSET,
    rate_burst: int | _Unset | None = UNSET,
    fair: bool | _Unset = UNSET,
    fair_weights: Mapping[str, float] | _Unset | None = UNSET,
    max_claimed_per_key: int | _Unset | None = UNSET,
    max_depth: int | _Unset | None = UNSET,
    max_children: int | _Unset | None = UNSET,
    max_descendants: int | _Unset | None = UNSET,
    limits: Iterable[str] | _Unset | None = UNSET,
    rate_per_key: float | _Unset | None = UNSET,
) -> Call[QueueControls]:
    """Only the settings given change; None removes a limit. ``fair``: claims take the todos' fair_keys
    in weighted round robin (``fair_weights``: key -> weight, default 1; ``max_claimed_per_key``: live
    leases per key). ``max_depth``, ``max_children``, ``max_descendants``: spawn caps of its trees."""
    limits = {
        "max_claimed": max_claimed,
        "rate_per_second": rate_per_second,
        "rate_burst": rate_burst,
        "fair": fair,
        "fair_weights": dict(fair_weights) if isinstance(fair_weights, Mapping) else fair_weights,
        "max_claimed_per_key": max_claimed_per_key,
        "max_depth": max_depth,
        "max_children": max_children,
        "max_descendants": max_descendants,
        "limits": list(limits) if not isinstance(limits, _Unset) and limits is not None else limits,
        "rate_per_key": rate_per_key,
    }
    body = {k: v for k, v in limits.items() if v is not UNSET}
    return Call("queues_limit", "PATCH", f"queues/{_queue_path(name)}/", QueueControls.from_json, body)


@operation("queues_pause")
def pause(name: str) -> Call[QueueControls]:
    return Call("queues_pause", "POST", f"queues/{_queue_path(name)}/pause/", QueueControls.from_json)


@operation("queues_resume")
def resume(name: str) -> Call[QueueControls]:
    return Call("queues_resume", "POST", f"queues/{_queue_path(name)}/resume/", QueueControls.from_json)


@operation("limits_retrieve")
def limit(name: str) -> Call[Limit]:
    return Call("limits_retrieve", "GET", f"limits/{_q(name)}/", Limit.from_json)


@operation("limits_put")
def put_limit(
    name: str,
    *,
    max_claimed: int | None = None,
    rate_per_second: float | None = None,
    rate_burst: int | None = None,
    per_key: int | None = None,
) -> Call[Limit]:
    """Define (or replace, whole) a named limit shared by every queue and todo naming it."""
    body = {
        "max_claimed": max_claimed,
        "rate_per_second": rate_per_second,
        "rate_burst": rate_burst,
        "per_key": per_key,
    }
    return Call("limits_put", "PUT", f"limits/{_q(name)}/", Limit.from_json, body)


@operation("limits_destroy")
def delete_limit(name: str) -> Call[Limit]:
    return Call("limits_destroy", "DELETE", f"limits/{_q(name)}/", Limit.from_json)


@operation("limits_unpark")
def unpark(name: str) -> Call[Limit]:
    """Lift a park: the limit's todos are claimable again."""
    return Call("limits_unpark", "DELETE", f"limits/{_q(name)}/park/", Limit.from_json)


@operation("schedules_list")
def schedules() -> Call[list[Schedule]]:
    return Call("schedules_list", "GET", "schedules/", lambda data: [Schedule.from_json(s) for s in data["schedules"]])


# --- events -----------------------------------------------------------------------------------------


@operation("v1_events_list")
def list_events(
    *,
    source: str | None = None,
    type: str | None = None,
    page_size: int | None = None,
    cursor: str | None = None,
) -> Call[Page[EventSummary]]:
    params = _given(source=source, type=type, page_size=page_size, cursor=cursor)
    return Call("v1_events_list", "GET", "events/", _page(EventSummary.from_json), params=params)


@operation("v1_events_retrieve")
def event(event_id: str) -> Call[Event]:
    return Call("v1_events_retrieve", "GET", f"events/{_q(event_id)}/", Event.from_json)


@operation("v1_events_replay_create")
def replay(event_id: str) -> Call[Replay]:
    return Call("v1_events_replay_create", "POST", f"events/{_q(event_id)}/replay/", Replay.from_json)
