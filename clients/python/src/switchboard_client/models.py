"""The API's objects as frozen dataclasses. Field names are the JSON's: tests/test_client_contract.py
compares each class with the server's OpenAPI component of the same name, so a field the API adds and
the client lacks fails CI. Fields a newer server sends that this client does not know yet are kept in
``extra`` rather than refused."""

from __future__ import annotations

import dataclasses
import typing
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Generic, Self, TypeVar

JSON = Any


def parse_datetime(value: str | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))


_DATETIME_FIELDS: dict[type, frozenset[str]] = {}


def _datetime_fields(cls: type) -> frozenset[str]:
    if cls not in _DATETIME_FIELDS:
        hints = typing.get_type_hints(cls)
        dates = {n for n, h in hints.items() if h is datetime or datetime in typing.get_args(h)}
        _DATETIME_FIELDS[cls] = frozenset(dates)
    return _DATETIME_FIELDS[cls]


@dataclass(frozen=True)
class Model:
    #: The OpenAPI component this class mirrors (the contract test reads it).
    schema: ClassVar[str] = ""
    extra: dict[str, JSON] = field(default_factory=dict, kw_only=True, repr=False, compare=False)

    @classmethod
    def json_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Self:
        known = set(cls.json_fields())
        dates = _datetime_fields(cls)
        values = {k: (parse_datetime(v) if k in dates else v) for k, v in data.items() if k in known}
        for name in known - values.keys():  # optional fields (the schema's non-required ones)
            values[name] = None
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})


@dataclass(frozen=True)
class Todo(Model):
    schema: ClassVar[str] = "Todo"
    id: str
    queue: str
    source: str
    kind: str
    title: str
    payload: JSON
    event: str | None
    idempotency_key: str | None
    assignee: str | None
    state: str
    dead_letter: bool
    owner: str | None
    lease_id: str | None
    lease_expires_at: datetime | None
    attempt: int
    max_attempts: int
    next_retry_at: datetime | None
    run_at: datetime | None
    priority: int
    #: On a fair queue, the tenant whose share of claims it takes ("" when none).
    fair_key: str
    result: JSON
    errors: list[dict[str, JSON]]
    #: {percent, message, at} from the holder's last heartbeat that carried it.
    progress: JSON
    #: What an earlier attempt saved (a heartbeat's checkpoint): a claimer resumes from it.
    checkpoint: JSON
    traceparent: str | None
    created_at: datetime | None
    updated_at: datetime | None
    claimed_at: datetime | None
    completed_at: datetime | None
    #: A dependency that dead-letters or is cancelled: "cancel" this todo too, or "run" it.
    on_dependency_failure: str | None
    #: The todos it depends on, in the order given, each with its state and result.
    dependencies: list[Dependency]
    #: While waiting: what it waits for ({"todos": [...]}, {"event": {...}} or {"token": true}).
    waiting_for: JSON
    #: How its last wait ended: {by, at, data | event | todos | timed_out}.
    resolution: JSON
    #: Its tree (agent trees): the todo whose lease's holder created it (None for a root), the root (its own
    #: id for a root) and how far below the root it is.
    parent_id: str | None = None
    root_id: str | None = None
    depth: int = 0
    #: "cancel": its finish cancels what is left under it; "keep" (default): not.
    children: str = "keep"
    #: The counters its workers reported ({tokens_in, cost_usd, ...}); a root's tree_usage sums its tree's.
    usage: JSON = None
    tree_usage: JSON = None
    #: A root's budget ({counter: limit}); blocked says {reason: "budget", root_id} while its tree has spent it.
    budget: JSON = None
    #: A cancelled todo's tombstone: the result its worker sent after the cancel ({result, at, owner}).
    late_result: JSON = None
    #: Named limits it names itself (its queue's are not listed).
    limits: list[str] = field(default_factory=list)
    #: While a limit holding it is parked: {limit, until, reason} (on a get or a list).
    blocked: JSON = None
    #: Its start-by deadline: not claimed by then, it is cancelled with reason "expired".
    expires_at: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Self:
        todo = super().from_json(data)
        return dataclasses.replace(todo, dependencies=[Dependency.from_json(d) for d in data.get("dependencies") or []])

    @property
    def finished(self) -> bool:
        return self.state in ("done", "cancelled") or self.dead_letter


@dataclass(frozen=True)
class Dependency(Model):
    """A todo another depends on, as it is now (``state`` None: retention removed it)."""

    schema: ClassVar[str] = "Dependency"
    id: str
    state: str | None
    dead_letter: bool
    result: JSON
    #: Past the size of results listed with the dependent: GET this todo for its result.
    result_truncated: bool | None = None


@dataclass(frozen=True)
class CreateOutcome(Model):
    """One item of a batch create: ``status`` 201 created, 200 the runnable todo holding its idempotency key."""

    schema: ClassVar[str] = "BatchCreateOutcome"
    status: int
    id: str
    state: str

    @property
    def created(self) -> bool:
        return self.status == 201


@dataclass(frozen=True)
class CreatedTodo(Todo):
    """A create's answer: the todo, and whether it is new (False: the idempotency key's holder)."""

    schema: ClassVar[str] = "CreatedTodo"
    created: bool = False


@dataclass(frozen=True)
class Waitpoint(Model):
    """A token wait's credential: whoever holds ``token`` (or POSTs to ``resolve_url``) resolves it."""

    schema: ClassVar[str] = "Waitpoint"
    token: str
    resolve_url: str


@dataclass(frozen=True)
class WaitingTodo(Todo):
    """A wait's answer: the todo, now waiting, and for a token wait its ``waitpoint`` (shown this once)."""

    schema: ClassVar[str] = "WaitingTodo"
    waitpoint: Waitpoint | None = None

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Self:
        todo = super().from_json(data)
        waitpoint = Waitpoint.from_json(data["waitpoint"]) if data.get("waitpoint") else None
        return dataclasses.replace(todo, waitpoint=waitpoint)


@dataclass(frozen=True)
class Resolved(Model):
    schema: ClassVar[str] = "Resolved"
    resolved: bool


@dataclass(frozen=True)
class QueueStats(Model):
    schema: ClassVar[str] = "QueueStats"
    queue: str
    pending: int
    claimed: int
    failed: int
    retry_waiting: int
    dead_letters: int
    scheduled: int
    waiting: int
    oldest_pending_age_seconds: float | None
    cancelled: int
    paused: bool
    max_claimed: int | None
    rate_per_second: float | None
    rate_burst: int | None


@dataclass(frozen=True)
class QueueControls(Model):
    schema: ClassVar[str] = "QueueControls"
    queue: str
    paused: bool
    max_claimed: int | None
    rate_per_second: float | None
    rate_burst: int | None
    #: Claims take the todos' fair_keys in weighted round robin (``fair_weights``: key -> weight, default 1).
    fair: bool
    fair_weights: dict[str, float]
    max_claimed_per_key: int | None
    #: Spawn caps of the trees rooted in this queue: levels below a root, unfinished children of a parent,
    #: todos ever created in one tree (None: no cap).
    max_depth: int | None = None
    max_children: int | None = None
    max_descendants: int | None = None
    #: Named limits every todo of the queue is held by.
    limits: list[str] | None = None
    #: Claims a second per fair_key, times the key's weight (a fair queue's).
    rate_per_key: float | None = None


@dataclass(frozen=True)
class Limit(Model):
    """A named limit, shared by every queue and todo naming it; ``parked``: {until, reason} while parked."""

    schema: ClassVar[str] = "Limit"
    name: str
    max_claimed: int | None
    rate_per_second: float | None
    rate_burst: int | None
    per_key: int | None
    parked: JSON
    created_at: datetime | None
    updated_at: datetime | None


@dataclass(frozen=True)
class EventSummary(Model):
    schema: ClassVar[str] = "EventSummary"
    id: str
    source: str
    type: str
    delivery_id: str
    headers: dict[str, JSON]
    received_at: datetime | None


@dataclass(frozen=True)
class EventTodo(Model):
    schema: ClassVar[str] = "EventTodo"
    id: str
    queue: str
    kind: str
    title: str
    state: str
    created_at: datetime | None


@dataclass(frozen=True)
class Event(EventSummary):
    schema: ClassVar[str] = "Event"
    payload: JSON = None
    todos: list[EventTodo] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Self:
        event = super().from_json(data)
        return dataclasses.replace(event, todos=[EventTodo.from_json(t) for t in data.get("todos") or []])


@dataclass(frozen=True)
class Replay(Model):
    schema: ClassVar[str] = "Replay"
    event_id: str
    todo_ids: list[str]
    created_todo_ids: list[str]


@dataclass(frozen=True)
class Schedule(Model):
    schema: ClassVar[str] = "Schedule"
    name: str
    cron: str
    timezone: str
    queue: str
    kind: str
    title: str
    payload: JSON
    priority: int
    fair_key: str
    max_attempts: int | None
    active: bool
    catch_up: str
    last_tick_at: datetime | None
    next_run_at: datetime | None
    last_todo: str | None
    last_error: str
    created_at: datetime | None
    limits: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ErrorBody(Model):
    schema: ClassVar[str] = "ErrorBody"
    code: str
    detail: str
    fields: dict[str, list[str]] | None = None
    state: str | None = None
    dead_letter: bool | None = None
    queues: list[str] | None = None
    path: str | None = None


@dataclass(frozen=True)
class BatchOutcome(Model):
    """One item of a batch complete: ``todo`` when it was completed (status 200), else ``error``."""

    schema: ClassVar[str] = "BatchOutcome"
    id: str
    status: int
    todo: Todo | None = None
    error: ErrorBody | None = None

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Self:
        outcome = super().from_json(data)
        todo = Todo.from_json(data["todo"]) if data.get("todo") else None
        error = ErrorBody.from_json(data["error"]) if data.get("error") else None
        return dataclasses.replace(outcome, todo=todo, error=error)

    @property
    def ok(self) -> bool:
        return self.status == 200


T = TypeVar("T")


@dataclass(frozen=True)
class TreeNode(Model):
    """One todo of a tree, as GET /todos/<id>/tree/ shows it."""

    schema: ClassVar[str] = "TreeNode"
    id: str
    parent_id: str | None
    depth: int
    state: str
    dead_letter: bool
    queue: str
    kind: str
    title: str


@dataclass(frozen=True)
class Explanation(Model):
    """Why a todo is not claimed now: each reason ({reason, detail, ...}) in order; ``claimable`` when none."""

    schema: ClassVar[str] = "Explanation"
    id: str
    claimable: bool
    reasons: list[dict[str, JSON]]
    #: What may still delay it though nothing stops it (a fair queue's turns).
    notes: list[dict[str, JSON]]


@dataclass(frozen=True)
class AgentExplanation(Model):
    """Why a claim by this agent gets nothing: per queue of its scopes, the reasons."""

    schema: ClassVar[str] = "AgentExplanation"
    agent: str
    queues: list[dict[str, JSON]]
    truncated: bool
    #: Names asked for that no claim scope covers.
    outside_scopes: list[str]


@dataclass(frozen=True)
class TreePage(Model):
    """A page of a todo's tree (the todo first, then by depth and id); ``next_cursor`` None on the last."""

    schema: ClassVar[str] = "TreePage"
    nodes: list[TreeNode]
    next: str | None
    #: The subtree of a todo below its root is walked up to a bound; past it, nodes are missing.
    truncated: bool
    #: The whole tree's usage summed on its root, its budget, and whether a counter reached it.
    tree_usage: JSON = None
    budget: JSON = None
    budget_exhausted: bool = False

    @classmethod
    def from_json(cls, data: dict[str, JSON]) -> Self:
        page = super().from_json(data)
        return dataclasses.replace(page, nodes=[TreeNode.from_json(n) for n in data.get("nodes") or []])

    @property
    def next_cursor(self) -> str | None:
        values = urllib.parse.parse_qs(urllib.parse.urlsplit(self.next).query).get("cursor") if self.next else None
        return values[0] if values else None


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list; ``next_cursor`` is None on the last page."""

    items: list[T]
    next_cursor: str | None
    previous_cursor: str | None
