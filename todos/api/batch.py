"""A batch create's input (POST /api/v1/todos/batch/, MCP create_for with todos): every item validated as
a create's body, with a fast path for the plain shape (issue 20: validating 1,000 items through DRF cost
longer than inserting them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.validators import MaxLengthValidator, ProhibitNullCharactersValidator
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from todos.api.fields import stored_json_bytes
from todos.api.serializers import BatchCreateInput, BatchCreateItemInput, ParentInput
from todos.errors import InvalidTransitionInput
from todos.limits import MAX_CREATE_BATCH, MAX_DEPENDENCIES
from todos.models import QUEUE_NAME_RE, TASK_SOURCE_PREFIXES, is_system_key

# --- the batch's fast path ----------------------------------------------------------------------
# DRF validates an item in about 0.1-0.2 ms, a batch of 1,000 in longer than the INSERT of it takes. Items
# of the plain shape (strings that need no trimming, JSON integers, no run_at or traceparent) are checked
# here directly, by rules read off BatchCreateItemInput's own fields (their bounds, blank and null, their
# defaults) and the payload's one rule (fields.stored_json_bytes); anything else, and every item with an
# error, goes to the serializer, which stays the authority and words the errors (test_api_batch checks that
# both agree). Only the keys an item has are checked; the others take the fields' defaults.
_CHAR_REFUSED = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates: CharField's validators


# What DRF's CharField checks by itself (the checks of _plain_text); a field with any other validator (the
# queue's name) has its own rule.
_CHAR_VALIDATORS = (MaxLengthValidator, ProhibitNullCharactersValidator, ProhibitSurrogateCharactersValidator)


def _plain_text(field: serializers.CharField) -> Any:
    limit, blank, null = field.max_length or 0, field.allow_blank, field.allow_null

    def check(value: Any) -> bool:
        if value is None:
            return null
        return (
            isinstance(value, str)
            and len(value) <= limit
            and (blank or value != "")
            # a value DRF would trim goes to it (fair_key keeps its whitespace: trim_whitespace=False)
            and (not field.trim_whitespace or value == value.strip())
            and not _CHAR_REFUSED.search(value)
        )

    return check


def _plain_int(value: Any, low: float, high: float) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _plain_payload(value: Any) -> bool:
    try:
        return value is not None and stored_json_bytes(value) <= settings.MAX_PAYLOAD_BYTES
    except serializers.ValidationError:
        return False


def _bounds(field: Any) -> tuple[float, float]:
    return field.min_value, field.max_value


def _fast_rules() -> tuple[dict[str, Any], dict[str, Any]]:
    """Per field of BatchCreateItemInput, a check of a plain valid value, and the defaults."""
    fields = BatchCreateItemInput().fields
    rules: dict[str, Any] = {
        name: _plain_text(field)
        for name, field in fields.items()
        if type(field) is serializers.CharField and all(isinstance(v, _CHAR_VALIDATORS) for v in field.validators)
    }
    attempts, priority, delay = (
        _bounds(fields["max_attempts"]),
        _bounds(fields["priority"]),
        _bounds(fields["delay_seconds"]),
    )
    index = _bounds(fields["depends_on_index"].child)  # type: ignore[attr-defined]
    dependency = _plain_text(fields["depends_on"].child)  # type: ignore[attr-defined]
    key = _plain_text(fields["idempotency_key"])  # type: ignore[arg-type]
    source = _plain_text(fields["source"])  # type: ignore[arg-type]
    policies = set(fields["on_dependency_failure"].choices)  # type: ignore[attr-defined]
    rules |= {
        # fullmatch: the pattern's $ would let a trailing newline through, which DRF trims first
        "queue": lambda v: isinstance(v, str) and QUEUE_NAME_RE.fullmatch(v) is not None,
        "idempotency_key": lambda v: key(v) and not is_system_key(v),
        "payload": _plain_payload,
        "max_attempts": lambda v: v is None or _plain_int(v, *attempts),
        "priority": lambda v: _plain_int(v, *priority),
        # FloatField turns an integer into a float: the fast path does the same (below)
        "delay_seconds": lambda v: (
            v is None or (not isinstance(v, bool) and isinstance(v, int | float) and delay[0] <= v <= delay[1])
        ),
        "depends_on": lambda v: isinstance(v, list) and all(d is not None and dependency(d) for d in v),
        "depends_on_index": lambda v: isinstance(v, list) and all(_plain_int(j, *index) for j in v),
        "on_dependency_failure": lambda v: isinstance(v, str) and v in policies,
        "run_at": lambda v: v is None,  # a time to parse: the serializer's
        "traceparent": lambda v: v is None,  # a header to parse: the serializer's
        "spawn_caps": lambda v: v is None,  # an object to validate: the serializer's
        "children": lambda v: v in ("keep", "cancel"),
        "budget": lambda v: v is None,  # counters to validate: the serializer's
        "callback": lambda v: v is None,  # an object to validate: the serializer's
        # a task protocol's reserved prefix (mcp-task:, a2a:) is the serializer's 400
        "source": lambda v: source(v) and not v.startswith(TASK_SOURCE_PREFIXES),
        "limits": lambda v: v is None,  # names to validate (issue 31): the serializer's
        "expires_at": lambda v: v is None,  # a time to parse: the serializer's
        "expire_after_seconds": lambda v: v is None,  # a bound to check (issue 31): the serializer's
    }
    # A callable default (payload's dict) makes a fresh value per item, as DRF does: none is shared.
    defaults = {name: field.default for name, field in fields.items() if field.default is not serializers.empty}
    assert rules.keys() == fields.keys(), "every field of a batch item has its fast check"
    return rules, defaults


_FAST_RULES, _DEFAULTS = _fast_rules()
_FAST_DEFAULTS = {name: value for name, value in _DEFAULTS.items() if not callable(value)}
_FAST_FACTORIES = {name: value for name, value in _DEFAULTS.items() if callable(value)}


def fast_item(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The item as BatchCreateItemInput would validate it, or None to let the serializer decide."""
    rules = _FAST_RULES
    for name, value in raw.items():
        rule = rules.get(name)
        if rule is None or not rule(value):
            return None
    if "queue" not in raw or len(raw.get("depends_on", ())) + len(raw.get("depends_on_index", ())) > MAX_DEPENDENCIES:
        return None
    item = {**_FAST_DEFAULTS, **raw}
    for name, make in _FAST_FACTORIES.items():
        if name not in raw:
            item[name] = make()
    if item["delay_seconds"] is not None:
        item["delay_seconds"] = float(item["delay_seconds"])
    return item


def valid_batch(data: Any) -> list[dict[str, Any]]:
    """The items of a batch create, each validated as a create's body (plus depends_on_index); any invalid
    item refuses the whole batch: 400 naming each bad item's fields as ``todos.<index>.<field>``."""
    raw = data.get("todos") if isinstance(data, Mapping) and set(data) - {"parent"} == {"todos"} else None
    if isinstance(raw, list) and 0 < len(raw) <= MAX_CREATE_BATCH and all(isinstance(i, dict) for i in raw):
        fast = [fast_item(i) for i in raw]
        if all(f is not None for f in fast):
            return fast  # type: ignore[return-value]
    outer = BatchCreateInput(data=data)
    outer.is_valid(raise_exception=True)
    items = BatchCreateItemInput(data=outer.validated_data["todos"], many=True)
    if items.is_valid():
        return [dict(item) for item in items.validated_data]
    errors: dict[str, Any] = {}
    # DRF keys a list's errors by index (a dict of the bad items), or lists them all (older releases).
    raw = items.errors
    by_index = dict(raw) if isinstance(raw, Mapping) else dict(enumerate(raw))
    for index, item_errors in sorted(by_index.items()):
        named = dict(item_errors) if isinstance(item_errors, Mapping) else {"non_field_errors": item_errors}
        for field, messages in named.items():
            errors[f"todos.{index}.{field}"] = messages
    bad = sorted({int(k.split(".")[1]) for k in errors})
    first = ", ".join(k.split(".", 2)[2] for k in errors if k.startswith(f"todos.{bad[0]}."))
    more = f", and {len(bad) - 1} more" if len(bad) > 1 else ""
    raise InvalidTransitionInput(f"Item {bad[0]} is invalid ({first}){more}; nothing was written.", fields=errors)


def batch_parent(data: Any) -> dict[str, str] | None:
    """A batch's ``parent`` (every item's), validated as a create's: 400 naming ``parent.<field>``."""
    if not isinstance(data, Mapping) or data.get("parent") is None:
        return None
    parent = ParentInput(data=data["parent"])
    if not parent.is_valid():
        errors = parent.errors
        named = dict(errors) if isinstance(errors, Mapping) else {"non_field_errors": errors}
        raise InvalidTransitionInput(
            "parent is invalid; nothing was written.", fields={f"parent.{k}": v for k, v in named.items()}
        )
    return dict(parent.validated_data)
