"""Input and output shapes of the todos API. Input serializers validate and bound every value; none
of them saves anything (todos/queue/ is the only writer)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from todos import limits
from todos.api.fields import (
    BoundedJSONField,
    CheckpointField,
    LeaseSecondsField,
    PriorityField,
    RFC3339Field,
    ScopeGlobField,
    StrictBooleanField,
    TraceparentField,
    _iso,
    _lease_id_field,
    _worker_field,
)
from todos.errors import InvalidTransitionInput
from todos.limits import (
    DEPENDENCY_RESULTS_MAX_BYTES,
    LONG_POLL_MAX_SECONDS,
    MAX_CHECKPOINT_BYTES,
    MAX_CLAIM_BATCH,
    MAX_COMPLETE_BATCH,
    MAX_CREATE_BATCH,
    MAX_DELAY_SECONDS,
    MAX_DEPENDENCIES,
    MAX_ERROR_CHARS,
    MAX_FAIR_KEY_CHARS,
    MAX_NOTE_CHARS,
    MAX_PROGRESS_MESSAGE_CHARS,
    MAX_QUEUE_LIMIT,
    MAX_RETRY_IN_SECONDS,
    MAX_TREE_DEPTH,
    MAX_USAGE_COUNTERS,
    OUTBOUND_MAX_URL_CHARS,
    WAIT_TIMEOUT_MAX_SECONDS,
)
from todos.models import (
    OnDependencyFailure,
    Schedule,
    Todo,
    TodoState,
    validate_caller_idempotency_key,
    validate_caller_source,
    validate_limit_name,
    validate_queue_name,
)
from todos.queue import TodoRef
from todos.selectors import dependencies_of
from todos.usage import blocked, counters

# --- output -----------------------------------------------------------------------------------


class DependencySerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    state = serializers.CharField(allow_null=True, help_text="null: retention removed it")
    dead_letter = serializers.BooleanField()
    result = serializers.JSONField(allow_null=True)
    result_truncated = serializers.BooleanField(
        required=False, help_text=f"past the {DEPENDENCY_RESULTS_MAX_BYTES // 1024} KiB of results listed: GET it"
    )


class TodoSerializer(serializers.ModelSerializer[Todo]):
    dead_letter = serializers.SerializerMethodField(help_text="Failed with no retry scheduled.")
    limits = serializers.SerializerMethodField(help_text="Named limits it names itself (its queue's are not listed).")
    blocked = serializers.SerializerMethodField(
        help_text="While a limit holding it is parked: {limit, until, reason} (on GET of it or of a list); while "
        "its tree has spent its budget (issue 30): {reason: budget, root_id}."
    )
    dependencies = serializers.SerializerMethodField(
        help_text=f"The todos it depends on, in the order given (at most {MAX_DEPENDENCIES}), each with its "
        f"state and result; results past {DEPENDENCY_RESULTS_MAX_BYTES // 1024} KiB together are left out "
        "(result_truncated)."
    )
    event = serializers.CharField(source="event_id", allow_null=True, read_only=True)
    # A field named like Serializer.errors: the metaclass takes declared fields off the class, so the
    # property is not shadowed at run time (the stub cannot know).
    errors = serializers.ListField(child=serializers.DictField(), read_only=True)  # type: ignore[assignment]
    waiting_for = serializers.JSONField(
        read_only=True, allow_null=True, help_text="While waiting: the `for` it waits for (never a token)."
    )
    parent_id = serializers.CharField(
        read_only=True, allow_null=True, help_text="The todo whose lease's holder created it; null for a root."
    )
    root_id = serializers.CharField(source="tree_root_id", read_only=True, help_text="Its tree's root: its own id.")
    depth = serializers.IntegerField(source="tree_depth", read_only=True, help_text="Below its root: 0 for a root.")
    children = serializers.CharField(
        source="children_policy",
        read_only=True,
        help_text="`cancel`: its finish cancels what is left under it; `keep` (default): not.",
    )
    usage = serializers.JSONField(
        read_only=True, allow_null=True, help_text="The counters its workers reported {tokens_in, cost_usd, ...}."
    )
    tree_usage = serializers.JSONField(
        read_only=True, allow_null=True, help_text="A root's: the whole tree's usage summed (its own included)."
    )
    budget = serializers.JSONField(
        read_only=True, allow_null=True, help_text="A root's budget {counter: limit}; null: none."
    )
    late_result = serializers.JSONField(
        read_only=True,
        allow_null=True,
        help_text="A cancelled todo's tombstone: the result {result, at, owner} its worker sent after the cancel "
        "revoked its lease (kept, not applied).",
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
            "on_dependency_failure",
            "dependencies",
            "waiting_for",
            "resolution",
            "parent_id",
            "root_id",
            "depth",
            "children",
            "usage",
            "tree_usage",
            "budget",
            "late_result",
            "limits",
            "blocked",
            "expires_at",
        ]
        read_only_fields = fields

    def get_dead_letter(self, todo: Todo) -> bool:
        return todo.is_dead_letter

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_blocked(self, todo: Todo) -> dict[str, Any] | None:
        return blocked(todo)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_limits(self, todo: Todo) -> list[str]:
        return todo.limits or []

    @extend_schema_field(DependencySerializer(many=True))
    def get_dependencies(self, todo: Todo) -> list[dict[str, Any]]:
        # A query only for a todo created with dependencies (most have none), unless its claim loaded them.
        if not todo.depends_on:
            return []
        loaded: list[dict[str, Any]] | None = getattr(todo, "dependency_list", None)
        return loaded if loaded is not None else dependencies_of([todo.id])[todo.id]

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
            "on_dependency_failure": todo.on_dependency_failure,
            "dependencies": self.get_dependencies(todo),
            "waiting_for": todo.waiting_for if todo.state == TodoState.WAITING else None,
            "resolution": todo.resolution,
            "parent_id": todo.parent_id,
            "root_id": todo.root_id or todo.id,
            "depth": todo.depth or 0,
            "children": todo.children_policy,
            "usage": todo.usage,
            "tree_usage": todo.tree_usage,
            "budget": todo.budget,
            "late_result": todo.late_result,
            "limits": todo.limits or [],
            "blocked": self.get_blocked(todo),
            "expires_at": _iso(todo.expires_at),
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
            "spawn_limit",
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
    max_depth = serializers.IntegerField(allow_null=True, help_text="of its trees: levels below the root")
    max_children = serializers.IntegerField(allow_null=True, help_text="of its trees: unfinished children a parent")
    max_descendants = serializers.IntegerField(allow_null=True, help_text="of its trees: todos ever made, a tree")
    limits = serializers.ListField(
        child=serializers.CharField(), allow_null=True, help_text="named limits every todo of it is held by"
    )
    rate_per_key = serializers.FloatField(allow_null=True, help_text="claims a second per fair_key, times its weight")


def _limit_names_field(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=limits.MAX_LIMIT_NAME_CHARS, validators=[validate_limit_name]),
        max_length=limits.MAX_LIMITS_NAMED,
        required=False,
        allow_null=True,
        **kwargs,
    )


class LimitSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    max_claimed = serializers.IntegerField(allow_null=True, help_text="live leases of its todos at once")
    rate_per_second = serializers.FloatField(allow_null=True, help_text="claims of its todos a second")
    rate_burst = serializers.IntegerField(allow_null=True, help_text="the token bucket's size")
    per_key = serializers.IntegerField(allow_null=True, help_text="live leases per fair_key, times its weight")
    parked = serializers.DictField(allow_null=True, help_text="{until, reason} while parked; null otherwise")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return instance.as_json()  # type: ignore[no-any-return]


# --- input ------------------------------------------------------------------------------------


_field_templates: dict[type[serializers.Serializer[Any]], dict[str, serializers.Field[Any, Any, Any, Any]]] = {}
_field_templates_lock = threading.Lock()


class StrictInput(serializers.Serializer[Any]):
    """A request body that refuses fields it does not declare (as SQS and Stripe do): a misspelt
    ``titel`` is a 400 naming it, not a todo with an empty title.

    Its fields are built once per class: DRF deep-copies every declared field for each instance (a new
    Field, validators and all, per field per request: the largest share of a claim's validation,
    profiled in issue 32). Each instance gets a shallow copy of the class's unbound fields, which binding
    then changes only on the copy (its name, parent, source); a nested serializer, or a field whose
    default is a mutable value, or a field with a child (a ListField's), is still deep-copied."""

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        cls = type(self)
        template = _field_templates.get(cls)
        if template is None:
            with _field_templates_lock:
                template = _field_templates.setdefault(cls, copy.deepcopy(self._declared_fields))
        return {name: _fresh(field) for name, field in template.items()}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if k not in self.fields)
            if unknown:
                expected = ", ".join(self.fields)
                raise serializers.ValidationError(
                    {k: [f"Unknown field; expected one of: {expected}."] for k in unknown}
                )
        return super().to_internal_value(data)


def _fresh(field: serializers.Field[Any, Any, Any, Any]) -> serializers.Field[Any, Any, Any, Any]:
    """A copy of an unbound template field that binding can change without touching the template."""
    if (
        isinstance(field, serializers.BaseSerializer)
        or hasattr(field, "child")  # a ListField's or DictField's child is bound to its parent
        or isinstance(getattr(field, "default", None), dict | list | set)
    ):
        return copy.deepcopy(field)
    return copy.copy(field)


class ParentInput(StrictInput):
    """The receipt of a todo the caller holds (its id and the claim's lease_id): the new todo is its child."""

    id = serializers.CharField(max_length=40)
    lease_id = _lease_id_field()


_PARENT_HELP = (
    "A todo you hold, by its receipt {id, lease_id}: the new todo is its child (parent_id, root_id, depth), "
    "within its tree's spawn caps. 409 `conflict` if you do not hold that lease, `spawn_limit` over a cap."
)


class SpawnCapsInput(StrictInput):
    """A root's own spawn caps: its tree takes the smaller of these and its queue's."""

    max_depth = serializers.IntegerField(min_value=0, max_value=MAX_TREE_DEPTH, required=False)
    max_children = serializers.IntegerField(min_value=0, max_value=MAX_QUEUE_LIMIT, required=False)
    max_descendants = serializers.IntegerField(min_value=0, max_value=MAX_QUEUE_LIMIT, required=False)


class CountersField(serializers.JSONField):
    """Named counters {name: number} (issue 30: usage, budget), checked by the queue's one rule
    (todos/queue/trees.py, counters): bounded names and count, non-negative numbers (above 0 for a budget)."""

    def __init__(self, *, positive: bool = False, **kwargs: Any) -> None:
        self.positive = positive
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        try:
            return counters(data, self.field_name or "usage", positive=self.positive)
        except InvalidTransitionInput as exc:
            raise serializers.ValidationError(exc.detail) from None


_USAGE_HELP = (
    "What this attempt used since its last report, as named counters {tokens_in, tokens_out, cost_usd, ...} "
    f"(at most {MAX_USAGE_COUNTERS}, each a number 0 or more): added to the todo's usage and its tree's."
)


class CallbackInput(StrictInput):
    """Where to POST the todo when it is done or dead-lettered: a signed Standard Webhooks request."""

    url = serializers.CharField(max_length=OUTBOUND_MAX_URL_CHARS)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=["done", "dead_lettered"]),
        required=False,
        min_length=1,
        max_length=2,
        help_text="Default both.",
    )


class TodoCreateInput(StrictInput):
    queue = serializers.CharField(max_length=200, validators=[validate_queue_name])
    kind = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    title = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    payload = BoundedJSONField(required=False, default=dict)
    # Named like Field.source; the metaclass takes it off the class (see TodoSerializer.errors).
    source = serializers.CharField(  # type: ignore[assignment]
        max_length=100, required=False, allow_blank=True, default="", validators=[validate_caller_source]
    )
    idempotency_key = serializers.CharField(
        max_length=300,
        required=False,
        allow_null=True,
        default=None,
        validators=[validate_caller_idempotency_key],
        help_text="Same key, same queue, while that todo can still run: that todo, not a new one. Keys starting "
        "`ingest:` or `schedule:` are the system's (400).",
    )
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
    depends_on = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        max_length=MAX_DEPENDENCIES,
        help_text=f"Ids of todos (at most {MAX_DEPENDENCIES}, each visible to you) that must finish first: until "
        "then it is `waiting`. 404 naming an id you cannot see.",
    )
    on_dependency_failure = serializers.ChoiceField(
        choices=OnDependencyFailure.choices,
        required=False,
        help_text="A dependency that dead-letters or is cancelled: `cancel` this todo too (default), or `run` it.",
    )
    parent = ParentInput(required=False, allow_null=True, default=None, help_text=_PARENT_HELP)
    spawn_caps = SpawnCapsInput(
        required=False,
        allow_null=True,
        default=None,
        help_text="A root's own spawn caps {max_depth, max_children, max_descendants}, tighter than its queue's "
        "(the smaller holds). Not with parent.",
    )
    children = serializers.ChoiceField(
        choices=[("keep", "keep"), ("cancel", "cancel")],
        required=False,
        default="keep",
        help_text="When this todo finishes (done, dead-letter, cancelled): `cancel` what is left under it, in "
        "the same transaction, or `keep` it (default).",
    )
    budget = CountersField(
        positive=True,
        required=False,
        allow_null=True,
        default=None,
        help_text="A root's budget {cost_usd: 5, ...}: once its tree's usage reaches a counter's limit, claims "
        "skip the tree's todos (blocked: budget) until an operator raises it. Not with parent.",
    )
    callback = CallbackInput(
        required=False,
        allow_null=True,
        default=None,
        help_text="{url, events}: a signed webhook (todo.done / todo.dead_lettered, the todo's JSON) to url when "
        "the todo gets there, signed with your agent's webhook_secret (docs/producers.md). A private or loopback "
        "URL is a 400 naming callback.url.",
    )
    limits = _limit_names_field(
        default=None, help_text="Named limits (PUT /limits/<name>/) it is held by, beside its queue's."
    )
    expires_at = RFC3339Field(
        required=False,
        allow_null=True,
        default=None,
        help_text="Start-by deadline (RFC 3339): not claimed by then, it is cancelled with reason `expired`.",
    )
    expire_after_seconds = serializers.FloatField(
        min_value=0.001,
        max_value=MAX_DELAY_SECONDS,
        required=False,
        allow_null=True,
        default=None,
        help_text="Start-by deadline this many seconds from now. Not with expires_at.",
    )
    supersede = StrictBooleanField(
        required=False,
        default=False,
        help_text="Cancel the runnable todo holding idempotency_key (its holder gets 409 superseded) and create "
        "this one.",
    )
    debounce_seconds = serializers.FloatField(
        min_value=0,
        max_value=MAX_DELAY_SECONDS,
        required=False,
        allow_null=True,
        default=None,
        help_text="One todo per idempotency_key, run this long after the last create (its run_at moves).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("run_at") is not None and attrs.get("delay_seconds") is not None:
            message = "Give run_at or delay_seconds, not both."
            raise serializers.ValidationError({"run_at": [message], "delay_seconds": [message]})
        return attrs


class TodoAwaitInput(serializers.Serializer[Any]):
    wait_seconds = serializers.FloatField(
        min_value=0,
        max_value=LONG_POLL_MAX_SECONDS,
        default=0,
        help_text="Await the result: answer when the todo is finished (done, a dead-letter, cancelled) or after "
        f"this many seconds (at most {LONG_POLL_MAX_SECONDS:g}), with the todo as it then is.",
    )


class BatchCreateItemInput(TodoCreateInput):
    parent = None  # type: ignore[assignment]  # a batch names one parent for all its items (BatchCreateInput)
    supersede = None  # type: ignore[assignment]  # one key at a time (issue 31): a single create's
    debounce_seconds = None  # type: ignore[assignment]
    depends_on_index = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=MAX_CREATE_BATCH - 1),
        required=False,
        max_length=MAX_DEPENDENCIES,
        help_text="Earlier items of this batch (by index) that must finish first.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if len(attrs.get("depends_on", ())) + len(attrs.get("depends_on_index", ())) > MAX_DEPENDENCIES:
            raise serializers.ValidationError(
                {"depends_on": [f"At most {MAX_DEPENDENCIES} dependencies, depends_on and depends_on_index together."]}
            )
        return attrs


class BatchCreateInput(StrictInput):
    todos = serializers.ListField(
        child=serializers.DictField(), allow_empty=False, max_length=MAX_CREATE_BATCH, help_text="Each a create's body."
    )
    parent = ParentInput(required=False, allow_null=True, default=None, help_text="Every item's. " + _PARENT_HELP)


class BatchCreateOutcomeSerializer(serializers.Serializer[Any]):
    status = serializers.IntegerField(help_text="201 created, 200 existing (it held the idempotency key)")
    id = serializers.CharField()
    state = serializers.CharField()


def batch_outcomes(outcomes: list[tuple[TodoRef, bool]]) -> list[dict[str, Any]]:
    """A batch create's answer: per item its status, id and state, not the whole todo (a thousand todos'
    JSON would cost more to build and send than the INSERT of them; a client GETs the few it needs)."""
    return [{"status": 201 if created else 200, "id": todo.id, "state": todo.state} for todo, created in outcomes]


class BatchCreateResultSerializer(serializers.Serializer[Any]):
    outcomes = BatchCreateOutcomeSerializer(many=True)


class TreeNodeSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    parent_id = serializers.CharField(allow_null=True, help_text="null for the root")
    depth = serializers.IntegerField(help_text="below the root: 0 for the root")
    state = serializers.CharField()
    dead_letter = serializers.BooleanField()
    queue = serializers.CharField()
    kind = serializers.CharField()
    title = serializers.CharField()


class TreePageSerializer(serializers.Serializer[Any]):
    nodes = TreeNodeSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="the next page's URL; null on the last")
    truncated = serializers.BooleanField(help_text="a subtree below its root past the walk's bound: nodes missing")
    tree_usage = serializers.JSONField(
        allow_null=True, help_text="the whole tree's usage, summed on its root (null: none, or a root you cannot see)"
    )
    budget = serializers.JSONField(allow_null=True, help_text="the root's budget {counter: limit}")
    budget_exhausted = serializers.BooleanField(help_text="a counter reached its budget: claims skip the tree")


class TreeInput(serializers.Serializer[Any]):
    cursor = serializers.CharField(max_length=200, required=False, help_text="from `next`")


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
    # Named like Field.root; the metaclass takes it off the class (see TodoSerializer.errors).
    root = serializers.CharField(max_length=40, required=False, help_text="a tree: this root and its descendants")  # type: ignore[assignment]


class ClaimNextInput(StrictInput):
    queues = serializers.ListField(
        child=ScopeGlobField(),
        required=False,
        max_length=50,
        help_text="Queue names or globs narrowing the agent's claim scopes (never widening them).",
    )
    lease_seconds = LeaseSecondsField()
    limit = serializers.IntegerField(min_value=1, max_value=MAX_CLAIM_BATCH, default=1)
    wait_seconds = serializers.FloatField(
        min_value=0, max_value=LONG_POLL_MAX_SECONDS, default=0, help_text="Long-poll: wait this long for work."
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


class HeartbeatInput(StrictInput):
    lease_id = _lease_id_field()
    lease_seconds = LeaseSecondsField()
    progress = ProgressInput(required=False, help_text="How far the work is: {percent 0-100, message}.")
    checkpoint = CheckpointField(
        required=False,
        help_text=f"A JSON object (at most {MAX_CHECKPOINT_BYTES // 1024} KB) handed to the next claimer if this "
        "attempt ends.",
    )
    usage = CountersField(required=False, allow_null=True, default=None, help_text=_USAGE_HELP)


class CompleteInput(StrictInput):
    lease_id = _lease_id_field()
    result = BoundedJSONField(required=False, allow_null=True, default=None)
    usage = CountersField(required=False, allow_null=True, default=None, help_text=_USAGE_HELP)


class BudgetInput(StrictInput):
    budget = CountersField(
        positive=True, help_text="The root's new budget {counter: limit, ...}, replacing its old one."
    )


class ParkInput(StrictInput):
    """A quota wall: the named limit (one the todo names) lets nothing through until ``until``."""

    limit = serializers.CharField(max_length=limits.MAX_LIMIT_NAME_CHARS, validators=[validate_limit_name])
    until = RFC3339Field(help_text="When the wall resets (RFC 3339, with an offset), at most 7 days ahead.")
    reason = serializers.CharField(
        max_length=limits.MAX_PARK_REASON_CHARS, required=False, allow_blank=True, default=""
    )


_PARK_HELP = (
    "Hit a quota wall: the todo goes back to pending with its attempt given back, and the named limit it "
    "names is parked until `until` (its todos, in every queue, wait with `blocked`)."
)


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
    park = ParkInput(required=False, allow_null=True, default=None, help_text=_PARK_HELP)


class ReleaseInput(StrictInput):
    lease_id = _lease_id_field()
    park = ParkInput(required=False, allow_null=True, default=None, help_text=_PARK_HELP)


class WaitInput(StrictInput):
    lease_id = _lease_id_field()
    # "for" is a Python keyword: declared through the class namespace (todos/waitpoints.py checks it).
    vars()["for"] = serializers.JSONField(
        help_text='Exactly one of {"todos": [ids]}, {"event": {"source", "type" (glob), "match": '
        '{"dotted.path": value}}}, {"token": true}, {"people": {"users", "groups", "title", "body", "decisions", '
        '"edit_schema", "arguments", "remind_after_seconds", "escalate_after_seconds", "escalate_to"}} '
        "(docs/agents.md)."
    )
    timeout_seconds = serializers.FloatField(
        min_value=1,
        max_value=WAIT_TIMEOUT_MAX_SECONDS,
        help_text=f"Required: up to {WAIT_TIMEOUT_MAX_SECONDS // 86400} days ({WAIT_TIMEOUT_MAX_SECONDS:,} s).",
    )
    on_timeout = serializers.ChoiceField(
        choices=["pending", "fail"],
        default="pending",
        help_text="pending: runnable again with timed_out; fail: a failure that counts toward the attempts.",
    )
    resolvers = serializers.ListField(
        child=serializers.CharField(max_length=300),
        max_length=limits.WAIT_RESOLVERS_MAX,
        required=False,
        help_text="Who besides the token holder and operators may resolve this wait (POST "
        "/todos/<id>/resolve/): agent names, or scope:<glob> for any agent holding a claim scope the glob "
        "matches. Never the waiting agent. Absent: no agent may.",
    )


class ResolveInput(StrictInput):
    # Named like Serializer.data; the metaclass takes it off the class (see TodoSerializer.errors).
    data = BoundedJSONField(  # type: ignore[assignment]
        required=False, allow_null=True, default=None, help_text="Handed to the next claim."
    )


class WaitpointResolveInput(ResolveInput):
    token = serializers.CharField(
        max_length=100, help_text="The waitpoint's token (wpt_...): in the body, so it stays out of URLs and logs."
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
    items = BatchItemInput(many=True, allow_empty=False, max_length=MAX_COMPLETE_BATCH)  # type: ignore[call-arg]


class CancelInput(StrictInput):
    reason = serializers.CharField(
        max_length=MAX_NOTE_CHARS, required=False, allow_blank=True, default="", help_text="kept in the history"
    )
    cascade = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Cancel its unfinished descendants too (those in your scopes), in the same transaction; each "
        "records `ancestor <id> cancelled by <you>`. A huge tree is finished by the reaper.",
    )


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
    # Spawn caps (issue 30) of the trees whose root is in this queue: 409 spawn_limit for a create past one.
    max_depth = serializers.IntegerField(
        min_value=0, max_value=MAX_TREE_DEPTH, required=False, allow_null=True, help_text="levels below a root"
    )
    max_children = serializers.IntegerField(
        min_value=0, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True, help_text="unfinished, a parent"
    )
    max_descendants = serializers.IntegerField(
        min_value=0, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True, help_text="ever created, a tree"
    )
    limits = _limit_names_field(help_text="named limits every todo of the queue is held by; null or []: none")
    rate_per_key = serializers.FloatField(
        min_value=0.001, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True, help_text="a fair queue's"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError(
                "Give at least one of max_claimed, rate_per_second, rate_burst, fair, fair_weights, "
                "max_claimed_per_key, max_depth, max_children, max_descendants, limits, rate_per_key."
            )
        return attrs


class LimitInput(StrictInput):
    """PUT: the limit's settings, whole (a field left out is null: no bound of that kind)."""

    max_claimed = serializers.IntegerField(min_value=0, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True)
    rate_per_second = serializers.FloatField(
        min_value=0.001, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True
    )
    rate_burst = serializers.IntegerField(
        min_value=1, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True, help_text="default: 1 s of the rate"
    )
    per_key = serializers.IntegerField(
        min_value=1, max_value=MAX_QUEUE_LIMIT, required=False, allow_null=True, help_text="live leases per key"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("rate_burst") is not None and attrs.get("rate_per_second") is None:
            raise serializers.ValidationError({"rate_burst": ["rate_burst needs a rate_per_second."]})
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
            "limits",
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
