"""The todos API's custom serializer fields: each parses or bounds one value, so that a bad one is a 400
naming its field before anything runs (todos/api/serializers.py declares the inputs and outputs).
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from todos import tracing
from todos.errors import PayloadTooLarge
from todos.globs import collapse_stars
from todos.limits import MAX_CHECKPOINT_BYTES, MAX_DELAY_SECONDS, MAX_JSON_DEPTH
from todos.models import PRIORITY_MAX, PRIORITY_MIN, validate_scope

MIN_LEASE_SECONDS = 1.0
LEASE_ID_MAX = 40
WORKER_RE = r"^[A-Za-z0-9._:@-]{1,99}$"


def _max_lease() -> float:
    return float(settings.QUEUE_MAX_LEASE_SECONDS)


def _unstorable(value: Any) -> str | None:
    """Why PostgreSQL's jsonb would refuse this JSON value (NUL in a string, a number out of range), or None.
    Iterative, as ingest/intake.py's walk is: the nesting depth is the sender's, so recursion would be a
    500 (RecursionError) where a 400 belongs."""
    stack = [value]
    while stack:  # reversed pushes: the first problem in document order is the one named
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "JSON strings may not contain NUL (\\u0000) characters."
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "JSON numbers must be finite."
        elif isinstance(item, dict):
            for key, member in reversed(item.items()):
                stack += (member, key)
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return None


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels deep. Iterative, as above."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth == limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def check_nesting(value: Any, text: str) -> None:
    """A ValidationError when ``value`` (whose JSON text is ``text``) nests deeper than MAX_JSON_DEPTH. The
    walk runs only when the text has that many brackets at all: the common case costs two C-speed counts."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _nested_deeper_than(value, MAX_JSON_DEPTH):
        raise serializers.ValidationError(f"The JSON value is nested more than {MAX_JSON_DEPTH} levels deep.")


_STORED_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # made once, not per call


def stored_json_bytes(value: Any) -> int:
    """The size of a JSON value as stored (compact UTF-8), or a ValidationError saying why PostgreSQL's jsonb
    would refuse it: the one rule for payloads, used by BoundedJSONField and the batch's fast path."""
    try:
        text = _STORED_JSON.encode(value)
    except RecursionError as exc:
        raise serializers.ValidationError("The JSON value is nested too deeply.") from exc
    except ValueError as exc:  # a non-finite number (_unstorable names the first problem, as below)
        raise serializers.ValidationError(_unstorable(value) or "JSON numbers must be finite.") from exc
    # One C-speed dump serves the common case; the walk runs only when the text hints at a problem
    # (a NUL is written \u0000; so is a backslash followed by u0000, which the walk clears).
    if "\\u0000" in text and (reason := _unstorable(value)):
        raise serializers.ValidationError(reason)
    check_nesting(value, text)
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:
        raise serializers.ValidationError("JSON strings may not contain lone surrogate characters.") from exc


class BoundedJSONField(serializers.JSONField):
    """Any JSON value, at most MAX_PAYLOAD_BYTES once serialised (413 ``too_large`` beyond)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        # What jsonb cannot hold is refused as invalid here rather than failing in the database.
        size = stored_json_bytes(value)
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


class CheckpointField(serializers.JSONField):
    """A JSON object of at most MAX_CHECKPOINT_BYTES: what a retry needs to resume, not the work's data."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("A checkpoint is a JSON object.")
        try:
            reason = _unstorable(value)
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            size = len(text.encode())
        except (RecursionError, UnicodeEncodeError) as exc:
            raise serializers.ValidationError("The checkpoint cannot be stored as JSON.") from exc
        if reason:
            raise serializers.ValidationError(reason)
        check_nesting(value, text)
        if size > MAX_CHECKPOINT_BYTES:
            raise serializers.ValidationError(
                f"The checkpoint is {size} bytes of JSON; the limit is {MAX_CHECKPOINT_BYTES}."
            )
        return value


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false (BooleanField would also take "yes", 1 and "on")."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError("Must be true or false.")
        return data


class ScopeGlobField(serializers.CharField):
    """A queue name or a glob of ``*`` and ``?`` (a claim's ``queues`` item), its runs of ``*`` collapsed
    (``a***`` is ``a*``) and at most MAX_SCOPE_WILDCARDS wildcards: matched as data (todos/globs.py), but
    bounded so that no caller's pattern costs the server more than a scope does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=200, validators=[validate_scope], **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if len(value) > 200:  # as given, before collapsing: max_length checks only the collapsed value
            self.fail("max_length", max_length=200)
        return collapse_stars(value)
