"""Input and output shapes of the todos API. Input serializers validate and bound every value; none
of them saves anything (todos/queue.py is the only writer)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from todos import tracing
from todos.errors import PayloadTooLarge
from todos.models import (
    MAX_DELAY_SECONDS,
    MAX_FAIR_KEY_CHARS,
    MAX_QUEUE_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    SCOPE_RE,
    Schedule,
    Todo,
    TodoState,
    validate_queue_name,
    validate_scope,
)

MAX_CLAIM_LIMIT = 100
MAX_WAIT_SECONDS = 20.0
MIN_LEASE_SECONDS = 1.0
MAX_RETRY_IN_SECONDS = 7 * 24 * 3600.0
MAX_ERROR_CHARS = 10_000
MAX_NOTE_CHARS = 1_000
MAX_BATCH_ITEMS = 100
MAX_PROGRESS_MESSAGE_CHARS = 500
MAX_CHECKPOINT_BYTES = 64 * 1024
LEASE_ID_MAX = 40
WORKER_RE = r"^[A-Za-z0-9._:@-]{1,99}$"


def _max_lease() -> float:
    return float(settings.QUEUE_MAX_LEASE_SECONDS)


def _unstorable(value: Any) -> str | None:
    """Why PostgreSQL's jsonb would refuse this JSON value (NUL in a string, a number out of range), or None."""
    if isinstance(value, str):
        return "JSON strings may not contain NUL (\\u0000) characters." if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "JSON numbers must be finite."
    if isinstance(value, dict):
        return next((r for k, v in value.items() if (r := _unstorable(k) or _unstorable(v))), None)
    if isinstance(value, list):
        return next((r for v in value if (r := _unstorable(v))), None)
    return None


class BoundedJSONField(serializers.JSONField):
    """Any JSON value, at most MAX_PAYLOAD_BYTES once serialised (413 ``too_large`` beyond)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        # What jsonb cannot hold is refused as invalid here rather than failing in the database.
        try:
            reason = _unstorable(value)
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except RecursionError as exc:
            raise serializers.ValidationError("The JSON value is nested too deeply.") from exc
        if reason:
            raise serializers.ValidationError(reason)
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise serializers.ValidationError("JSON strings may not contain lone surrogate characters.") from exc
        if size > settings.MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(
                f"{self.field_name} is {size} bytes of JSON; the limit is {settings.MAX_PAYLOAD_BYTES}.",
                fields={self.field_name: ["too large"]},
            )
        return value


class LeaseSecondsField(serializers.FloatField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            required=False,
            min_value=MIN_LEASE_SECONDS,
            # Shown in the schema; run_validation re-reads the setting, so an override applies at once.
            max_value=_max_lease(),
            help_text="Lease (visibility timeout) in seconds, 1 to QUEUE_MAX_LEASE_SECONDS (12 h by default); "
            "default QUEUE_DEFAULT_LEASE_SECONDS.",
            **kwargs,
        )

    def run_validation(self, data: Any = serializers.empty) -> Any:
        value = super().run_validation(data)
        if value is not None and value > _max_lease():
            raise serializers.ValidationError(f"Ensure this value is less than or equal to {_max_lease():g}.")
        return value


def _worker_field() -> serializers.RegexField:
    return serializers.RegexField(
        WORKER_RE,
        required=False,
        help_text="A label for the process or thread holding the claim; the owner becomes '<agent>/<worker>'.",
    )


def _lease_id_field() -> serializers.CharField:
    return serializers.CharField(max_length=LEASE_ID_MAX, help_text="The receipt handed out by the claim.")


def _iso(value: datetime | None) -> str | None:
    """As DRF's DateTimeField renders it: ISO 8601, UTC as Z."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# --- output -----------------------------------------------------------------------------------


class TodoSerializer(serializers.ModelSerializer[Todo]):
    dead_letter = serializers.SerializerMethodField(help_text="Failed with no retry scheduled.")
    event = serializers.CharField(source="event_id", allow_null=True, read_only=True)
    # A field named like Serializer.errors: the metaclass takes declared fields off the class, so the
    # property is not shadowed at run time (the stub cannot know).
    errors = serializers.ListField(child=serializers.DictField(), read_only=True)  # type: ignore[assignment]
    waiting_for = serializers.JSONField(
        read_only=True, allow_null=True, help_text="While waiting: the `for` it waits for (never a token)."
    )
    resolution = serializers.JSONField(
        read_only=True,
        allow_null=True,
        help_text="How its last wait ended: {by: todos | event | token | agent | operator | timeout, at, and "
        "data, event {id, source, type, payload}, todos [{id, state, result}] or timed_out}. A result over "
        "4,000 characters of JSON reads {truncated: true} (GET that todo for it).",
    )

    class Meta:
        model = Todo
        fields = [
            "id",
            "queue",
            "source",
            "kind",
            "title",
            "payload",
            "event",
            "idempotency_key",
            "assignee",
            "state",
            "dead_letter",
            "owner",
            "lease_id",
            "lease_expires_at",
            "attempt",
            "max_attempts",
            "next_retry_at",
            "run_at",
            "priority",
            "fair_key",
            "result",
            "errors",
            "progress",
            "checkpoint",
            "traceparent",
            "created_at",
            "updated_at",
            "claimed_at",
            "completed_at",
            "waiting_for",
            "resolution",
        ]
        read_only_fields = fields

    def get_dead_letter(self, todo: Todo) -> bool:
        return todo.is_dead_letter

    def to_representation(self, todo: Todo) -> dict[str, Any]:
        # The API's hottest path (every claim and completion renders todos): built directly, which is
        # several times cheaper than ModelSerializer's per-instance field machinery. The declared
        # fields above still define the OpenAPI schema; test_api_todos checks the two agree.
        return {
            "id": todo.id,
            "queue": todo.queue,
            "source": todo.source,
            "kind": todo.kind,
            "title": todo.title,
            "payload": todo.payload,
            "event": todo.event_id,
            "idempotency_key": todo.idempotency_key,
            "assignee": todo.assignee,
            "state": todo.state,
            "dead_letter": todo.is_dead_letter,
            "owner": todo.owner,
            "lease_id": todo.lease_id,
            "lease_expires_at": _iso(todo.lease_expires_at),
            "attempt": todo.attempt,
            "max_attempts": todo.max_attempts,
            "next_retry_at": _iso(todo.next_retry_at),
            "run_at": _iso(todo.run_at),
            "priority": todo.priority,
            "fair_key": todo.fair_key,
            "result": todo.result,
            "errors": todo.errors,
            "progress": todo.progress,
            "checkpoint": todo.checkpoint,
            "traceparent": todo.traceparent,
            "created_at": _iso(todo.created_at),
            "updated_at": _iso(todo.updated_at),
            "claimed_at": _iso(todo.claimed_at),
            "completed_at": _iso(todo.completed_at),
            "waiting_for": todo.waiting_for if todo.state == TodoState.WAITING else None,
            "resolution": todo.resolution,
        }


class CreatedTodoSerializer(TodoSerializer):
    created = serializers.BooleanField(help_text="False when an existing runnable todo held the idempotency key.")

    class Meta(TodoSerializer.Meta):
        fields = [*TodoSerializer.Meta.fields, "created"]
        read_only_fields = fields

    def to_representation(self, todo: Todo) -> dict[str, Any]:
        return {**super().to_representation(todo), "created": todo.created}  # type: ignore[attr-defined]


class ClaimedSerializer(serializers.Serializer[Any]):
    todos = TodoSerializer(many=True)


class ErrorBodySerializer(serializers.Serializer[Any]):
    code = serializers.ChoiceField(
        choices=[
            "not_found",
            "conflict",
            "invalid",
            "unauthorized",
            "forbidden",
            "method_not_allowed",
            "too_large",
            "internal",
            "unavailable",
            "timeout",
        ]
    )
    detail = serializers.CharField()
    # Named like Serializer.fields; the metaclass takes it off the class (see TodoSerializer.errors).
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="invalid: the messages per input field.",
    )
    state = serializers.CharField(required=False, help_text="conflict: the todo's current state.")
    dead_letter = serializers.BooleanField(required=False, help_text="conflict: whether it is a dead-letter.")
    queues = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="forbidden (claim): the queues outside the scopes."
    )
    path = serializers.CharField(required=False, help_text="not_found: the path with a trailing slash, if it exists.")


class ErrorSerializer(serializers.Serializer[Any]):
    error = ErrorBodySerializer()


class BatchOutcomeSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    status = serializers.IntegerField(help_text="200 done, 404 not found, 409 conflict: as the single complete.")
    todo = TodoSerializer(required=False)
    error = ErrorBodySerializer(required=False)


class BatchCompleteResultSerializer(serializers.Serializer[Any]):
    outcomes = BatchOutcomeSerializer(many=True)


class QueueStatsSerializer(serializers.Serializer[Any]):
    queue = serializers.CharField()
    pending = serializers.IntegerField()
    claimed = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="retry_waiting + dead_letters")
    retry_waiting = serializers.IntegerField()
    dead_letters = serializers.IntegerField()
    scheduled = serializers.IntegerField(help_text="waiting for their run_at")
    waiting = serializers.IntegerField(help_text="waiting for dependencies, an event, a token or a resolve")
    oldest_pending_age_seconds = serializers.FloatField(allow_null=True)
    cancelled = serializers.IntegerField(help_text="cancelled todos not yet removed by retention")
    paused = serializers.BooleanField()
    max_claimed = serializers.IntegerField(allow_null=True)
    rate_per_second = serializers.FloatField(allow_null=True)
    rate_burst = serializers.IntegerField(allow_null=True)


class QueueListSerializer(serializers.Serializer[Any]):
    queues = QueueStatsSerializer(many=True)


class QueueControlsSerializer(serializers.Serializer[Any]):
    queue = serializers.CharField(source="name")
    paused = serializers.BooleanField()
    max_claimed = serializers.IntegerField(allow_null=True, help_text="live leases at once; null: no cap")
    rate_per_second = serializers.FloatField(allow_null=True, help_text="claims a second; null: no limit")
    rate_burst = serializers.IntegerField(allow_null=True, help_text="the token bucket's size")
    fair = serializers.BooleanField(help_text="claims take the todos' fair_keys in weighted round robin")
    fair_weights = serializers.DictField(child=serializers.FloatField(), help_text="key -> weight; default 1")
    max_claimed_per_key = serializers.IntegerField(allow_null=True, help_text="live leases per key; null: no cap")


# --- input ------------------------------------------------------------------------------------

# RFC 3339's date-time: a T (or space), seconds, optional fraction, and an offset or Z. Python's
# fromisoformat alone would also take a date, a naive time or week dates.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


@extend_schema_field(OpenApiTypes.DATETIME)
class RFC3339Field(serializers.Field[datetime, Any, str | None, Any]):
    """An RFC 3339 timestamp with its offset, at most MAX_DELAY_SECONDS ahead (a naive time would be
    read in some server's zone: refused)."""

    default_error_messages = {
        "format": "Expected an RFC 3339 timestamp with an offset, e.g. 2026-01-02T03:04:05Z.",
        "far": "run_at may be at most a year ahead.",
    }

    def to_internal_value(self, data: Any) -> datetime:
        if not isinstance(data, str) or not _RFC3339.match(data):
            self.fail("format")
        try:
            value = datetime.fromisoformat(data.upper())  # out-of-range fields (month 13) raise
        except ValueError:
            self.fail("format")
        # A bound on the input, not a guard on state: the database's clock decides when it runs.
        if value > timezone.now() + timedelta(seconds=MAX_DELAY_SECONDS):
            self.fail("far")
        return value

    def to_representation(self, value: datetime) -> str | None:
        return _iso(value)


class PriorityField(serializers.IntegerField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            min_value=PRIORITY_MIN,
            max_value=PRIORITY_MAX,
            help_text="-100 to 100, default 0; lower runs first (claims take priority, then run_at).",
            **kwargs,
        )

    def to_internal_value(self, data: Any) -> int:
        # IntegerField would take "5", 5.0 and true; a priority is a JSON integer.
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictInput(serializers.Serializer[Any]):
    """A request body that refuses fields it does not declare (as SQS and Stripe do): a misspelt
    ``titel`` is a 400 naming it, not a todo with an empty title."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if k not in self.fields)
            if unknown:
                expected = ", ".join(self.fields)
                raise serializers.ValidationError(
                    {k: [f"Unknown field; expected one of: {expected}."] for k in unknown}
                )
        return super().to_internal_value(data)


class TraceparentField(serializers.CharField):
    """A W3C traceparent header value (version 00)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            max_length=55,
            help_text="W3C trace context (00-<trace-id>-<parent-id>-<flags>): the todo's spans join this trace.",
            **kwargs,
        )

    def to_internal_value(self, data: Any) -> str:
        value = str(super().to_internal_value(data))
        if tracing.parse(value) is None:
            raise serializers.ValidationError("Expected a W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>.")
        return value


class TodoCreateInput(StrictInput):
    queue = serializers.CharField(max_length=200, validators=[validate_queue_name])
    kind = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    title = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    payload = BoundedJSONField(required=False, default=dict)
    # Named like Field.source; the metaclass takes it off the class (see TodoSerializer.errors).
    source = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")  # type: ignore[assignment]
    idempotency_key = serializers.CharField(max_length=300, required=False, allow_null=True, default=None)
    assignee = serializers.CharField(
        max_length=100, required=False, allow_null=True, default=None, help_text="Only this agent may claim it."
    )
    max_attempts = serializers.IntegerField(min_value=1, max_value=100, required=False, allow_null=True, default=None)
    run_at = RFC3339Field(
        required=False,
        allow_null=True,
        default=None,
        help_text="When it may first run (RFC 3339, with an offset), at most a year ahead. In the future the "
        "todo is `scheduled`, invisible to claims until then. Not with delay_seconds.",
    )
    delay_seconds = serializers.FloatField(
        min_value=0,
        max_value=MAX_DELAY_SECONDS,
        required=False,
        allow_null=True,
        default=None,
        help_text="Run no sooner than this many seconds from now (0 to 31,536,000). Not with run_at.",
    )
    priority = PriorityField(default=0)
    fair_key = serializers.CharField(
        max_length=MAX_FAIR_KEY_CHARS,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="On a fair queue, the tenant (repository, customer, user) whose share of claims this todo takes.",
    )
    traceparent = TraceparentField(required=False, allow_null=True, default=None)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("run_at") is not None and attrs.get("delay_seconds") is not None:
            message = "Give run_at or delay_seconds, not both."
            raise serializers.ValidationError({"run_at": [message], "delay_seconds": [message]})
        return attrs


class TodoAwaitInput(serializers.Serializer[Any]):
    wait_seconds = serializers.FloatField(
        min_value=0,
        max_value=MAX_WAIT_SECONDS,
        default=0,
        help_text="Await the result: answer when the todo is finished (done, a dead-letter, cancelled) or after "
        "this many seconds (at most 20), with the todo as it then is.",
    )


class TodoPatchInput(StrictInput):
    priority = PriorityField()


class TodoListFilter(serializers.Serializer[Any]):
    queue = serializers.CharField(max_length=200, required=False)
    state = serializers.ChoiceField(choices=TodoState.values, required=False)
    kind = serializers.CharField(max_length=100, required=False)
    assignee = serializers.CharField(max_length=100, required=False)
    fair_key = serializers.CharField(
        max_length=MAX_FAIR_KEY_CHARS, required=False, allow_blank=True, trim_whitespace=False
    )
    dead = serializers.BooleanField(required=False, allow_null=True, default=None, help_text="true: dead-letters only")


class ClaimNextInput(StrictInput):
    queues = serializers.ListField(
        child=serializers.RegexField(SCOPE_RE.pattern, max_length=200, validators=[validate_scope]),
        required=False,
        max_length=50,
        help_text="Queue names or globs narrowing the agent's claim scopes (never widening them).",
    )
    lease_seconds = LeaseSecondsField()
    limit = serializers.IntegerField(min_value=1, max_value=MAX_CLAIM_LIMIT, default=1)
    wait_seconds = serializers.FloatField(
        min_value=0, max_value=MAX_WAIT_SECONDS, default=0, help_text="Long-poll: wait this long for work."
    )
    worker = _worker_field()


class ClaimOneInput(StrictInput):
    lease_seconds = LeaseSecondsField()
    worker = _worker_field()


class ProgressInput(StrictInput):
    percent = serializers.FloatField(min_value=0, max_value=100, required=False)
    message = serializers.CharField(max_length=MAX_PROGRESS_MESSAGE_CHARS, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Give percent (0-100), message, or both.")
        return attrs


class CheckpointField(serializers.JSONField):
    """A JSON object of at most MAX_CHECKPOINT_BYTES: what a retry needs to resume, not the work's data."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("A checkpoint is a JSON object.")
        try:
            reason = _unstorable(value)
            size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        except (RecursionError, UnicodeEncodeError) as exc:
            raise serializers.ValidationError("The checkpoint cannot be stored as JSON.") from exc
        if reason:
            raise serializers.ValidationError(reason)
        if size > MAX_CHECKPOINT_BYTES:
            raise serializers.ValidationError(
                f"The checkpoint is {size} bytes of JSON; the limit is {MAX_CHECKPOINT_BYTES}."
            )
        return value


class HeartbeatInput(StrictInput):
    lease_id = _lease_id_field()
    lease_seconds = LeaseSecondsField()
    progress = ProgressInput(required=False, help_text="How far the work is: {percent 0-100, message}.")
    checkpoint = CheckpointField(
        required=False, help_text="A JSON object (at most 64 KB) handed to the next claimer if this attempt ends."
    )


class CompleteInput(StrictInput):
    lease_id = _lease_id_field()
    result = BoundedJSONField(required=False, allow_null=True, default=None)


class FailInput(StrictInput):
    lease_id = _lease_id_field()
    error = serializers.CharField(max_length=MAX_ERROR_CHARS, required=False, allow_blank=True, default="")
    retry_in_seconds = serializers.FloatField(
        min_value=0,
        max_value=MAX_RETRY_IN_SECONDS,
        required=False,
        allow_null=True,
        default=None,
        help_text="Retry after this many seconds instead of the backoff (ignored at the attempt cap).",
    )


class ReleaseInput(StrictInput):
    lease_id = _lease_id_field()


class WaitInput(StrictInput):
    lease_id = _lease_id_field()
    # "for" is a Python keyword: declared through the class namespace (todos/waitpoints.py checks it).
    vars()["for"] = serializers.JSONField(
        help_text='Exactly one of {"todos": [ids]}, {"event": {"source", "type" (glob), "match": '
        '{"dotted.path": value}}}, {"token": true}.'
    )
    timeout_seconds = serializers.FloatField(
        min_value=1, max_value=30 * 24 * 3600, help_text="Required: up to 30 days (2,592,000 s)."
    )
    on_timeout = serializers.ChoiceField(
        choices=["pending", "fail"],
        default="pending",
        help_text="pending: runnable again with timed_out; fail: a failure that counts toward the attempts.",
    )


class ResolveInput(StrictInput):
    # Named like Serializer.data; the metaclass takes it off the class (see TodoSerializer.errors).
    data = BoundedJSONField(  # type: ignore[assignment]
        required=False, allow_null=True, default=None, help_text="Handed to the next claim."
    )


class WaitpointSerializer(serializers.Serializer[Any]):
    token = serializers.CharField(help_text="Shown this once; only its hash is stored.")
    resolve_url = serializers.CharField()


class WaitingTodoSerializer(TodoSerializer):
    waitpoint = WaitpointSerializer(required=False, help_text="For a token wait only.")

    class Meta(TodoSerializer.Meta):
        fields = [*TodoSerializer.Meta.fields, "waitpoint"]
        read_only_fields = fields


class ResolvedSerializer(serializers.Serializer[Any]):
    resolved = serializers.BooleanField()


class RetryInput(StrictInput):
    mode = serializers.ChoiceField(
        choices=["reset", "once"], help_text="reset: a full new budget (attempt = 0); once: exactly one more try."
    )
    note = serializers.CharField(max_length=MAX_NOTE_CHARS, required=False, allow_blank=True, default="")


class BatchItemInput(StrictInput):
    id = serializers.CharField(max_length=40)
    lease_id = _lease_id_field()
    result = BoundedJSONField(required=False, allow_null=True, default=None)


class BatchCompleteInput(StrictInput):
    items = BatchItemInput(many=True, allow_empty=False, max_length=MAX_BATCH_ITEMS)  # type: ignore[call-arg]


class CancelInput(StrictInput):
    reason = serializers.CharField(
        max_length=MAX_NOTE_CHARS, required=False, allow_blank=True, default="", help_text="kept in the history"
    )


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false (BooleanField would also take "yes", 1 and "on")."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError("Must be true or false.")
        return data


class QueueLimitsInput(StrictInput):
    """PATCH: only the controls named change; null removes one."""

    max_claimed = serializers.IntegerField(min_value=0, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True)
    rate_per_second = serializers.FloatField(
        min_value=0.001, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True
    )
    rate_burst = serializers.IntegerField(
        min_value=1,
        max_value=MAX_QUEUE_LIMIT,
        required=False,
        allow_null=True,
        help_text="default: one second's worth of the rate (at least 1)",
    )
    fair = StrictBooleanField(required=False, help_text="claims take the todos' fair_keys in weighted round robin")
    fair_weights = serializers.JSONField(
        required=False, allow_null=True, help_text="an object from fair_key to weight (above 0; default 1)"
    )
    max_claimed_per_key = serializers.IntegerField(
        min_value=1, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True, help_text="live leases per key"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError(
                "Give at least one of max_claimed, rate_per_second, rate_burst, fair, fair_weights, "
                "max_claimed_per_key."
            )
        return attrs


# --- schedules ---------------------------------------------------------------------------------


class ScheduleSerializer(serializers.ModelSerializer[Schedule]):
    active = serializers.BooleanField(source="is_active", read_only=True)
    next_run_at = serializers.SerializerMethodField(help_text="The next tick after now, in UTC.")
    last_todo = serializers.CharField(source="last_todo_id", allow_null=True, read_only=True)

    class Meta:
        model = Schedule
        fields = [
            "name",
            "cron",
            "timezone",
            "queue",
            "kind",
            "title",
            "payload",
            "priority",
            "fair_key",
            "max_attempts",
            "active",
            "catch_up",
            "last_tick_at",
            "next_run_at",
            "last_todo",
            "last_error",
            "created_at",
        ]
        read_only_fields = fields

    def get_next_run_at(self, schedule: Schedule) -> str | None:
        from todos.schedules import next_tick

        return _iso(next_tick(schedule, timezone.now()))


class ScheduleListSerializer(serializers.Serializer[Any]):
    schedules = ScheduleSerializer(many=True)
