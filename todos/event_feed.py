"""MCP Events' feed (issue 33 item 2): the event types an agent may subscribe to, and the one read that
answers "what happened in its scopes since this cursor" for every delivery mode (poll, push, webhook).

Events are read from what the todo rows already say; nothing is written on the hot path. There is no event
table, trigger or index: a claim or a complete pays nothing for events nobody subscribed to, and a
subscriber's read uses the indexes the queue already has (the pending claim scan for ``todo.ready``, the
primary keys for named todos, the waitpoints' own rows):

* ``todo.ready``: a todo became pending (created, released, retried, resolved) in a queue of the agent's
  claim scopes. Coalesced: one event per queue per read window, and windows are at least
  EVENTS_READY_INTERVAL_SECONDS apart, so at most one per queue per interval. ``data``: the queue and how
  many became ready.
* ``todo.finished``: a todo the agent may see (its claim and create scopes: the todos it created) became
  done, a dead-letter or cancelled; ``arguments.todos`` narrows it to the todos it awaits.
* ``wait.resolved``: a wait the agent made (its ``waiter``) was resolved or timed out.

The cursor is a time ("ev1.<microseconds>[.<id>]"): every row changed before it has been delivered. It is
a safe watermark even though a transaction's rows carry its *start* time (``now()``), which can be older
than rows committed before it: a read first takes the watermark as the earliest start of any transaction
still open in this database (pg_stat_activity) or the clock, whichever is earlier, then reads rows strictly
before it in a later statement. A transaction open at the first statement started at or after the
watermark, so all its rows are at or after it; one that started later has rows later still; so every row
before the watermark is committed and visible to the second statement. The cost: an idle-in-transaction
session holds the watermark back (events are late, never lost). The app's connections must share one
database role, so that pg_stat_activity shows their transactions' start times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Q

from todos import states
from todos.globs import compile_glob, matches_any, wildcards
from todos.limits import (
    EVENTS_MAX_TODOS_ARGUMENT,
    EVENTS_READY_INTERVAL_SECONDS,
    MAX_QUEUE_LIMIT,
    MAX_SCOPE_WILDCARDS,
    events_retention_seconds,
)
from todos.models import Agent, Todo, Waitpoint, glob_to_like

READY = "todo.ready"
FINISHED = "todo.finished"
WAIT_RESOLVED = "wait.resolved"
DELIVERY = ["poll", "push", "webhook"]

_QUEUE_ARG = {"type": "string", "maxLength": 200, "description": "A queue name or glob (* ?) in your scopes"}
EVENT_TYPES: list[dict[str, Any]] = [
    {
        "name": READY,
        "description": "Work became claimable in a queue of your claim scopes (at most one per queue per 5 s).",
        "delivery": DELIVERY,
        "inputSchema": {"type": "object", "properties": {"queue": _QUEUE_ARG}, "additionalProperties": False},
        "payloadSchema": {
            "type": "object",
            "properties": {"queue": {"type": "string"}, "count": {"type": "integer"}},
        },
    },
    {
        "name": FINISHED,
        "description": "A todo you may see finished (done, dead_lettered, cancelled); todos narrows it.",
        "delivery": DELIVERY,
        "inputSchema": {
            "type": "object",
            "properties": {
                "queue": _QUEUE_ARG,
                "todos": {"type": "array", "items": {"type": "string"}, "maxItems": EVENTS_MAX_TODOS_ARGUMENT},
            },
            "additionalProperties": False,
        },
        "payloadSchema": {
            "type": "object",
            "properties": {
                "todoId": {"type": "string"},
                "queue": {"type": "string"},
                "kind": {"type": "string"},
                "state": {"type": "string"},
            },
        },
    },
    {
        "name": WAIT_RESOLVED,
        "description": "A wait you made was resolved or timed out.",
        "delivery": DELIVERY,
        "inputSchema": {"type": "object", "properties": {"queue": _QUEUE_ARG}, "additionalProperties": False},
        "payloadSchema": {
            "type": "object",
            "properties": {"todoId": {"type": "string"}, "queue": {"type": "string"}},
        },
    },
]
NAMES = {t["name"] for t in EVENT_TYPES}

_CURSOR_RE = re.compile(r"^ev1\.(\d{1,18})(?:\.([A-Za-z0-9_-]{1,100}))?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class FeedError(Exception):
    """A subscription the feed refuses: ``kind`` is "invalid" (-32602), "forbidden" (-32012) or "not_found"
    (-32011, an unknown event name); ``field`` names the argument."""

    def __init__(self, kind: str, detail: str, *, field: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.field = field


@dataclass(frozen=True)
class Position:
    """Everything before ``at`` has been delivered, and at ``at`` everything up to ``key`` (None: nothing at
    ``at`` yet)."""

    at: datetime
    key: str | None = None

    def encode(self) -> str:
        micros = (self.at - _EPOCH) // timedelta(microseconds=1)
        return f"ev1.{micros}" + (f".{self.key}" if self.key else "")

    def after(self, column: str, key_column: str) -> Q:
        if self.key is None:
            return Q(**{f"{column}__gte": self.at})
        return Q(**{f"{column}__gt": self.at}) | Q(**{column: self.at, f"{key_column}__gt": self.key})


def decode_cursor(value: Any) -> Position | None:
    """A client's cursor (None or absent: start from now). Raises FeedError for anything this server did not
    mint."""
    if value is None:
        return None
    match = _CURSOR_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise FeedError("invalid", "Invalid cursor: pass back one this server gave, or null.", field="cursor")
    return Position(_EPOCH + timedelta(microseconds=int(match.group(1))), match.group(2))


@dataclass(frozen=True)
class Subscription:
    """A checked (name, arguments) for one agent: the LIKE patterns of the queues it reads, and the rest."""

    agent: Agent
    name: str
    arguments: dict[str, Any]
    patterns: list[str]
    queue_like: str | None = None
    todos: list[str] | None = None


def _covers(scopes: list[str], wanted: str) -> bool:
    """Whether ``wanted`` (a name or glob) is inside ``scopes``: a name one scope matches, or a glob that
    matches one scope read as a name (Agent.outside_claim_scopes' reading; the read itself also filters by
    the scopes' patterns, so no reading of "inside" can widen it)."""
    return matches_any(scopes, wanted) or any(compile_glob(wanted).matches(s) for s in scopes)


def check(agent: Agent, name: Any, arguments: Any) -> Subscription:
    """The subscription ``(name, arguments)`` for ``agent``, scoped exactly as REST reads: todo.ready in its
    claim scopes, the others in its claim and create scopes. Raises FeedError."""
    if not isinstance(name, str) or name not in NAMES:
        raise FeedError("not_found", f"Unknown event {str(name)[:100]!r}: see events/list.", field="name")
    args = {} if arguments is None else arguments
    if not isinstance(args, dict):
        raise FeedError("invalid", "arguments must be an object.", field="arguments")
    allowed = {"queue", "todos"} if name == FINISHED else {"queue"}
    if unknown := sorted(set(args) - allowed):
        raise FeedError("invalid", f"Unknown argument {unknown[0][:100]!r}.", field=f"arguments.{unknown[0][:100]}")
    scopes = agent.claim_scopes if name == READY else [*agent.claim_scopes, *agent.create_scopes]
    patterns = agent.claim_like_patterns() if name == READY else agent.visible_like_patterns()
    queue = args.get("queue")
    queue_like = None
    if queue is not None:
        if not isinstance(queue, str) or not queue or len(queue) > 200 or wildcards(queue) > MAX_SCOPE_WILDCARDS:
            detail = f"queue must be a queue name or a glob of at most {MAX_SCOPE_WILDCARDS} wildcards."
            raise FeedError("invalid", detail, field="arguments.queue")
        if not _covers(scopes, queue):
            which = "claim scopes" if name == READY else "scopes"
            raise FeedError("forbidden", f"The queue {queue[:200]!r} is outside your {which}.", field="arguments.queue")
        queue_like = glob_to_like(queue)
    todos = args.get("todos")
    if todos is not None:
        ok = isinstance(todos, list) and all(isinstance(t, str) and len(t) <= 40 for t in todos)
        if not ok or not todos or len(todos) > EVENTS_MAX_TODOS_ARGUMENT:
            raise FeedError(
                "invalid", f"todos must be 1 to {EVENTS_MAX_TODOS_ARGUMENT} todo ids.", field="arguments.todos"
            )
    return Subscription(agent, name, dict(args), patterns, queue_like, todos)


def watermark() -> datetime:
    """The position every row before which is committed (the module's docstring says why it is safe)."""
    with connection.cursor() as cursor:
        # pg_stat_activity: this database's open client transactions but this one's (autovacuum writes no todo).
        cursor.execute(
            "SELECT least(clock_timestamp(), min(xact_start)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL "
            "AND backend_type = 'client backend'"
        )
        at: datetime = cursor.fetchone()[0]
    return at


@dataclass
class Batch:
    """One read's answer: events in order, the cursor after them, and whether more wait or some were skipped."""

    events: list[dict[str, Any]] = field(default_factory=list)
    cursor: str = ""
    has_more: bool = False
    truncated: bool = False


def start(position: Position | None, max_age_ms: Any, now: datetime) -> tuple[Position, bool]:
    """Where a read begins, and whether that skipped events: null is now; a cursor older than the retention
    window or the client's maxAgeMs floor begins at that floor (truncated)."""
    if position is None:
        return Position(now), False
    floor = now - timedelta(seconds=events_retention_seconds())
    if isinstance(max_age_ms, int) and not isinstance(max_age_ms, bool) and 0 <= max_age_ms <= MAX_QUEUE_LIMIT * 1000:
        floor = max(floor, now - timedelta(milliseconds=max_age_ms))
    if position.at < floor:
        return Position(floor), True
    return position, False


def _occurrence(event_id: str, name: str, at: datetime, data: dict[str, Any]) -> dict[str, Any]:
    return {"eventId": event_id, "name": name, "timestamp": at.isoformat().replace("+00:00", "Z"), "data": data}


def read(sub: Subscription, since: Position, limit: int) -> Batch:
    """The events of ``sub`` from ``since`` up to the watermark, at most ``limit`` (then ``has_more``)."""
    until = watermark()
    if until <= since.at and since.key is None:
        return Batch(cursor=since.encode())
    if sub.name == READY:
        return _ready(sub, since, until, limit)
    if sub.name == FINISHED:
        todos = Todo.objects.filter(queue__like_any=sub.patterns)
        if sub.queue_like is not None:
            todos = todos.filter(queue__like_any=[sub.queue_like])
        if sub.todos is not None:
            todos = todos.filter(pk__in=sub.todos)
        # A done or cancelled todo's updated_at is its completed_at (one now()): the window's range on it is
        # an index condition of the partial indexes todo_done_recent and todo_cancelled_recent (a bitmap OR
        # with a dead-letter index: todo_failed_recent's range or todo_dead_letters'), never a table scan.
        completed = Q(completed_at__gte=since.at, completed_at__lt=until)
        in_window = (
            (states.DONE.q & completed)
            | (states.CANCELLED.q & completed)
            | (states.FAILED.q & Q(updated_at__gte=since.at, updated_at__lt=until) & Q(next_retry_at__isnull=True))
        )
        rows = list(
            todos.filter(in_window)
            .filter(since.after("updated_at", "id"), updated_at__lt=until)
            .order_by("updated_at", "id")
            .values_list("id", "queue", "kind", "state", "next_retry_at", "updated_at")[: limit + 1]
        )
        batch = Batch(cursor=Position(until).encode())
        for todo_id, queue, kind, state, _retry, at in rows[:limit]:
            shown = "dead_lettered" if state == states.TodoState.FAILED else state
            data = {"todoId": todo_id, "queue": queue, "kind": kind, "state": shown}
            batch.events.append(_occurrence(f"{FINISHED}:{todo_id}:{at.timestamp()}", FINISHED, at, data))
        return _paged(batch, rows, limit)
    waits = Waitpoint.objects.filter(
        waiter=sub.agent.name, queue__like_any=sub.patterns, resolved_at__isnull=False, resolved_at__lt=until
    )
    if sub.queue_like is not None:
        waits = waits.filter(queue__like_any=[sub.queue_like])
    resolved: list[Any] = list(
        waits.filter(since.after("resolved_at", "todo_id"))
        .order_by("resolved_at", "todo_id")
        .values_list("todo_id", "queue", "resolved_at")[: limit + 1]
    )
    batch = Batch(cursor=Position(until).encode())
    for todo_id, queue, at in resolved[:limit]:
        event_id = f"{WAIT_RESOLVED}:{todo_id}:{at.timestamp()}"
        batch.events.append(_occurrence(event_id, WAIT_RESOLVED, at, {"todoId": todo_id, "queue": queue}))
    return _paged(batch, resolved, limit)


def _paged(batch: Batch, rows: list[Any], limit: int) -> Batch:
    """More rows than ``limit``: the cursor stops after the last one shown (its time and id)."""
    if len(rows) > limit:
        last = rows[limit - 1]
        batch.cursor = Position(last[-1], last[0]).encode()
        batch.has_more = True
    return batch


def _ready(sub: Subscription, since: Position, until: datetime, limit: int) -> Batch:
    """todo.ready: queues with a todo that became pending in [since, until), one event each. Read through the
    pending claim scan index (queue first, pending rows only). A window shorter than the interval answers
    nothing and keeps the cursor (the caller waits): the coalescing. More queues than ``limit``: the first
    ones by name, and ``truncated`` (the sketch's server-side ceiling)."""
    if until - since.at < timedelta(seconds=EVENTS_READY_INTERVAL_SECONDS):
        return Batch(cursor=since.encode())
    todos = Todo.objects.filter(queue__like_any=sub.patterns).filter(states.PENDING.q)
    if sub.queue_like is not None:
        todos = todos.filter(queue__like_any=[sub.queue_like])
    from django.db.models import Count, Max

    rows = list(
        todos.filter(updated_at__gte=since.at, updated_at__lt=until)
        .values("queue")
        .annotate(count=Count("id"), at=Max("updated_at"))
        .order_by("queue")[: limit + 1]
    )
    window = Position(until).encode()
    batch = Batch(cursor=window, truncated=len(rows) > limit)
    for row in rows[:limit]:
        data = {"queue": row["queue"], "count": row["count"]}
        batch.events.append(_occurrence(f"{READY}:{row['queue']}:{window}", READY, row["at"], data))
    return batch


def ready_interval_left(position: Position, now: datetime) -> float:
    """Seconds until a todo.ready window from ``position`` is long enough to read."""
    return max(0.0, EVENTS_READY_INTERVAL_SECONDS - (now - position.at).total_seconds())


def canonical(arguments: dict[str, Any]) -> str:
    import json

    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


# --- Webhook subscriptions (events/subscribe), delivered by the notify sidecar through todos/notices.py ---

_SECRET_RE = re.compile(r"^whsec_[A-Za-z0-9+/]+={0,2}$")


def check_secret(secret: Any) -> str:
    """A Standard Webhooks secret: ``whsec_`` and base64 of 24 to 64 bytes (the sketch's rule)."""
    import base64
    import binascii

    if isinstance(secret, str) and len(secret) <= 200 and _SECRET_RE.match(secret):
        try:
            size = len(base64.b64decode(secret.removeprefix("whsec_"), validate=True))
        except (binascii.Error, ValueError):
            size = 0
        if 24 <= size <= 64:
            return secret
    raise FeedError("invalid", "delivery.secret must be whsec_ and base64 of 24 to 64 bytes.", field="delivery.secret")


def check_url(url: Any) -> str:
    """The callback URL: https (the sketch's rule; an operator's OUTBOUND_ALLOW_HOSTS bridge may be http), and
    through the SSRF guard of todos/notices.py (the sender checks it again on every hop)."""
    from urllib.parse import urlsplit

    from django.conf import settings

    from todos.errors import InvalidTransitionInput
    from todos.notices import check_outbound_url

    if not isinstance(url, str):
        raise FeedError("invalid", "delivery.url must be an https URL.", field="delivery.url")
    try:
        check_outbound_url(url, field="delivery.url")
    except InvalidTransitionInput as exc:
        raise FeedError("invalid", str(exc.detail), field="delivery.url") from exc
    parts = urlsplit(url)
    bridge = f"{parts.hostname}:{parts.port or 80}" in settings.OUTBOUND_ALLOW_HOSTS
    if parts.scheme.lower() != "https" and not bridge:
        raise FeedError("invalid", "delivery.url must be an https URL.", field="delivery.url")
    return url


def subscription_id(agent: Agent, url: str, name: str, arguments: dict[str, Any]) -> str:
    """The sketch's derived id: deterministic over (principal, url, name, arguments)."""
    import hashlib

    key = canonical({"agent": agent.pk, "url": url, "name": name, "arguments": arguments})
    return "sub_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def granted_ttl(ttl_ms: Any, explicit: bool) -> timedelta:
    """The TTL granted for a suggestion: absent is the default; a number is clamped to [min, max]; null (no
    expiry) is granted the max, finite (the sketch lets a server answer a finite refreshBefore to it)."""
    from todos.limits import (
        EVENTS_WEBHOOK_TTL_DEFAULT_SECONDS,
        EVENTS_WEBHOOK_TTL_MIN_SECONDS,
        events_webhook_ttl_max_seconds,
    )

    most = events_webhook_ttl_max_seconds()
    if not explicit:
        seconds = float(min(EVENTS_WEBHOOK_TTL_DEFAULT_SECONDS, most))
    elif ttl_ms is None:
        seconds = float(most)
    elif isinstance(ttl_ms, int) and not isinstance(ttl_ms, bool):
        seconds = min(max(ttl_ms / 1000, EVENTS_WEBHOOK_TTL_MIN_SECONDS), most)
    else:
        raise FeedError("invalid", "ttlMs must be an integer (milliseconds) or null.", field="ttlMs")
    return timedelta(seconds=seconds)


def check_cap(agent: Agent, key: str) -> None:
    """The subscription cap, before an endpoint is verified (the sketch: a refused subscription provisions
    nothing); subscribe checks it again under the agent's lock."""
    from todos.limits import events_max_subscriptions_per_agent
    from todos.models import EventSubscription

    most = events_max_subscriptions_per_agent()
    live = EventSubscription.objects.filter(agent=agent, refresh_before__gt=db_now())
    if most and not live.filter(pk=key).exists() and live.count() >= most:
        raise ResourceExhausted(most)


def subscribe(
    sub: Subscription, *, url: str, secret: str, cursor: Position | None, max_age_ms: Any, ttl: timedelta
) -> dict[str, Any]:
    """Create or refresh the webhook subscription of ``sub`` to ``url`` (one short transaction; the agent's row
    locked so that its count of subscriptions cannot be passed by concurrent subscribes). A live one keeps
    its cursor (the client's is at or behind it); a new or lapsed one starts from the client's."""
    from django.db import transaction

    from todos.limits import events_max_subscriptions_per_agent
    from todos.models import EventSubscription

    key = subscription_id(sub.agent, url, sub.name, sub.arguments)
    with transaction.atomic():
        Agent.objects.select_for_update().filter(pk=sub.agent.pk).values_list("pk").first()
        now = db_now()
        existing = EventSubscription.objects.filter(pk=key).first()
        live = existing is not None and existing.refresh_before > now
        if existing is not None and live:
            position, truncated = decode_cursor(existing.cursor), False
        else:
            held = EventSubscription.objects.filter(agent=sub.agent, refresh_before__gt=now).exclude(pk=key).count()
            most = events_max_subscriptions_per_agent()
            if most and held >= most:
                raise ResourceExhausted(most)
            position, truncated = start(cursor, max_age_ms, now)
        assert position is not None
        defaults: dict[str, Any] = {
            "agent": sub.agent,
            "name": sub.name,
            "arguments": sub.arguments,
            "url": url,
            "secret": secret,
            "cursor": position.encode(),
            "refresh_before": now + ttl,
            "refreshed_at": now,
            # A refresh is the client's liveness signal: it reactivates a suspended delivery (the sketch).
            "active": True,
            "failures": 0,
        }
        if existing is not None and existing.secret != secret:
            # Rotation: the old secret still signs, beside the new, for the grace window (signing_secrets).
            defaults |= {"previous_secret": existing.secret, "secret_rotated_at": now}
        elif existing is None or not live:
            defaults |= {"previous_secret": None, "secret_rotated_at": None, "failed_since": None, "last_error": None}
        EventSubscription.objects.update_or_create(pk=key, defaults=defaults)
    answer: dict[str, Any] = {
        "id": key,
        "refreshBefore": (now + ttl).isoformat().replace("+00:00", "Z"),
        "cursor": position.encode(),
        "truncated": truncated,
    }
    if existing is not None and live:
        # As it was before this refresh: active false says delivery had been suspended (this refresh has
        # just reactivated it); lastError is a category, never the endpoint's answer (no response oracle).
        status: dict[str, Any] = {
            "active": existing.active,
            "lastDeliveryAt": _iso(existing.last_delivery_at),
            "lastError": existing.last_error,
        }
        if existing.failed_since is not None:
            status["failedSince"] = _iso(existing.failed_since)
        answer["deliveryStatus"] = status
    return answer


def _iso(at: datetime | None) -> str | None:
    return at.isoformat().replace("+00:00", "Z") if at is not None else None


def record_delivery(subscription_id: str, error: str | None) -> None:
    """One delivery attempt's outcome on its subscription, in one UPDATE (concurrent senders count every
    attempt): a success clears the failures; a failure counts one more, keeps the first failure's time and its
    category, and at events_suspend_after_failures() consecutive ones suspends delivery (active false)."""
    from django.db.models import Case, F, Value, When
    from django.db.models.functions import Coalesce, Now

    from todos.limits import events_suspend_after_failures
    from todos.models import EventSubscription

    rows = EventSubscription.objects.filter(pk=subscription_id)
    if error is None:
        rows.update(failures=0, failed_since=None, last_error=None, last_delivery_at=Now())
        return
    most = events_suspend_after_failures()
    suspend = Value(False) if most == 1 else Case(When(failures__gte=most - 1, then=Value(False)), default=F("active"))
    rows.update(
        failures=F("failures") + 1,
        failed_since=Coalesce(F("failed_since"), Now()),
        last_error=error,
        active=suspend if most else F("active"),
    )


class ResourceExhausted(Exception):
    def __init__(self, most: int) -> None:
        super().__init__("subscriptions")
        self.most = most


def unsubscribe(agent: Agent, url: Any, name: Any, arguments: Any) -> bool:
    """Delete the caller's subscription with this key; False if it has none (the sketch's NotFound)."""
    from todos.models import EventSubscription

    if not isinstance(url, str) or not isinstance(name, str):
        return False
    args = {} if arguments is None else arguments
    if not isinstance(args, dict):
        return False
    deleted, _ = EventSubscription.objects.filter(pk=subscription_id(agent, url, name, args), agent=agent).delete()
    return deleted > 0


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now: datetime = cursor.fetchone()[0]
    return now


def enqueue_webhooks(limit: int = 100) -> int:
    """One round of the notify sidecar (manage.py notify): for each live subscription, its new events become
    signed deliveries (todos/notices.py notify_url: the queue's retries and dead-letters apply), and its
    cursor moves past them, in one transaction per subscription (skip-locked: sidecars share the work). A
    lapsed subscription is deleted. The agent's scopes are read afresh each round (a narrowed or
    deactivated agent's subscription ends). Returns the deliveries enqueued."""
    from django.db import transaction

    from todos.limits import EVENTS_DEFAULT_MAX_EVENTS
    from todos.models import EventSubscription
    from todos.notices import Notice, notify_url

    now = db_now()
    EventSubscription.objects.filter(refresh_before__lte=now).delete()
    sent = 0
    live = EventSubscription.objects.filter(refresh_before__gt=now, active=True)  # a suspended one waits
    for pk in live.order_by("pk").values_list("pk", flat=True)[:limit]:
        with transaction.atomic():
            row = (
                EventSubscription.objects.select_for_update(skip_locked=True)
                .select_related("agent")
                .filter(pk=pk, refresh_before__gt=now, active=True)
                .first()
            )
            if row is None:
                continue
            try:
                if not row.agent.is_active:
                    raise FeedError("forbidden", "The agent was deactivated.", field="name")
                sub = check(row.agent, row.name, row.arguments)
            except FeedError as exc:  # deactivated, or its scopes no longer cover it: the sketch's envelope
                _terminate(row, exc.detail)
                row.delete()
                continue
            position = decode_cursor(row.cursor)
            assert position is not None
            position, gap = start(position, None, now)
            if gap:
                # Its cursor fell behind the retention window (the sidecar was down, or delivery was suspended
                # that long): the events before the floor are not replayed, and the receiver is told at once.
                _control(row, {"type": "gap", "cursor": position.encode()})
                row.cursor = position.encode()
                row.save(update_fields=["cursor"])
                sent += 1
            if sub.name == READY and ready_interval_left(position, now) > 0:
                continue
            batch = read(sub, position, EVENTS_DEFAULT_MAX_EVENTS)
            for event in batch.events:
                body = {**event, "cursor": batch.cursor}
                notice = Notice(
                    key=f"event:{row.pk}:{event['eventId']}"[:250],
                    event=sub.name,
                    subject=f"{event['eventId']} to {row.pk}",
                    text="",
                    data=body,
                )
                notify_url(
                    url=row.url,
                    secret=row.secret,
                    notice=notice,
                    body=body,
                    msg_id=event["eventId"],
                    headers={"X-MCP-Subscription-Id": row.pk},
                )
                sent += 1
            row.cursor = batch.cursor
            if batch.events:
                row.last_delivery_at = now
            row.save(update_fields=["cursor", "last_delivery_at"])
    return sent


def _terminate(row: Any, reason: str) -> None:
    """Enqueue the sketch's signed ``terminated`` envelope to a subscription that is ending."""
    _control(row, {"type": "terminated", "error": {"code": -32012, "message": "Forbidden", "data": {"reason": reason}}})


def _control(row: Any, body: dict[str, Any]) -> None:
    """Enqueue one of the sketch's control envelopes (``gap``, ``terminated``) to a subscription: signed and
    headed like an event, its webhook-id ``msg_<type>_<random>``."""
    import secrets

    from todos.notices import Notice, notify_url

    msg_id = f"msg_{body['type']}_{secrets.token_hex(8)}"
    notice = Notice(key=f"event:{row.pk}:{msg_id}", event=body["type"], subject=f"{msg_id} to {row.pk}", text="")
    notify_url(
        url=row.url,
        secret=row.secret,
        notice=notice,
        body=body,
        msg_id=msg_id,
        headers={"X-MCP-Subscription-Id": row.pk},
    )


class CallbackEndpointError(Exception):
    """The sketch's -32015: the callback endpoint failed verification or could not be reached. ``reason`` is
    one of its categories, never the endpoint's own answer (no response oracle for an agent's URL)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def failure_reason(failure: str) -> str:
    if failure.startswith("HTTP 4"):
        return "http_4xx"
    if failure.startswith("HTTP "):
        return "http_5xx"
    if "SSL" in failure or "certificate" in failure.lower():
        return "tls_error"
    if "Timeout" in failure or "no answer within" in failure:
        return "timeout"
    return "connection_refused"


def verify_endpoint(agent: Agent, url: str, secret: str, subscription: str) -> None:
    """The sketch's endpoint verification (anti-flooding): before the first delivery to a ``(principal, url)``,
    POST a signed ``verification`` envelope with a single-use challenge through the sender of
    todos/outbound.py (the SSRF guard on the connection, no redirect), and accept the URL only if the answer
    is 2xx and echoes the challenge (compared in constant time). A live subscription of the agent to the URL
    is the cached verification (persisted with it, as the sketch asks of durable subscriptions). Raises
    CallbackEndpointError."""
    import hmac
    import json
    import secrets

    from todos.models import EventSubscription
    from todos.outbound import DeliveryFailed, post_webhook

    if EventSubscription.objects.filter(agent=agent, url=url, refresh_before__gt=db_now()).exists():
        return
    challenge = secrets.token_urlsafe(24)
    msg_id = f"msg_verification_{secrets.token_hex(8)}"
    body = {"type": "verification", "challenge": challenge}
    headers = {"X-MCP-Subscription-Id": subscription}
    try:
        sent = post_webhook(url, secret, msg_id, body, field="delivery.url", extra_headers=headers, redirects=0)
    except DeliveryFailed as exc:
        raise CallbackEndpointError(failure_reason(str(exc))) from None
    try:
        echoed = json.loads(sent.body).get("challenge")
    except (ValueError, AttributeError):
        echoed = None
    if not isinstance(echoed, str) or not hmac.compare_digest(echoed.encode(), challenge.encode()):
        raise CallbackEndpointError("challenge_failed")
