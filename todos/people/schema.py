"""The JSON Schema subset of an edit (issue 29): what a person may change of the proposed arguments.

A schema is an object schema of flat fields: ``{"type": "object", "properties": {name: field},
"required": [names]}``, each field ``{"type": "string"|"integer"|"number"|"boolean", "enum": [...],
"maxLength": n, "minimum": n, "maximum": n, "title": "...", "description": "..."}``. Any other keyword is
refused when the wait is made (a 400 naming it), so nothing here ever evaluates a pattern, a reference or
a nested schema: the checks are a few comparisons per field, and the decision page builds one input per
field. Written here rather than taken from a library because the subset is what makes it safe.
"""

from __future__ import annotations

import math
from typing import Any

from todos import limits
from todos.errors import InvalidTransitionInput

FIELD_TYPES = ("string", "integer", "number", "boolean")
_FIELD_KEYWORDS = {"type", "enum", "maxLength", "minimum", "maximum", "title", "description"}
_OBJECT_KEYWORDS = {"type", "properties", "required", "title", "description"}
_LABEL_MAX = limits.PEOPLE_LABEL_MAX_CHARS


def _bad(detail: str, name: str) -> InvalidTransitionInput:
    return InvalidTransitionInput(detail, field=name)


def _is_number(value: Any) -> bool:
    # Finite only: NaN passes every comparison with a bound, and neither it nor infinity is JSON.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fits(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return _is_number(value) and float(value).is_integer()
    return _is_number(value)


def _check_field(name: str, spec: Any, at: str) -> None:
    if not isinstance(spec, dict):
        raise _bad(f"{name!r} must be a schema object.", at)
    if unknown := sorted(set(spec) - _FIELD_KEYWORDS):
        raise _bad(f"{name!r}: keyword {unknown[0]!r} is not supported (only {sorted(_FIELD_KEYWORDS)}).", at)
    kind = spec.get("type")
    if kind not in FIELD_TYPES:
        raise _bad(f"{name!r}: type must be one of {', '.join(FIELD_TYPES)}.", at)
    for label in ("title", "description"):
        if label in spec and not (isinstance(spec[label], str) and len(spec[label]) <= _LABEL_MAX):
            raise _bad(f"{name!r}: {label} is a string of up to {_LABEL_MAX} characters.", at)
    if "enum" in spec:
        enum = spec["enum"]
        if not isinstance(enum, list) or not 1 <= len(enum) <= limits.PEOPLE_SCHEMA_MAX_ENUM:
            raise _bad(f"{name!r}: enum lists 1 to {limits.PEOPLE_SCHEMA_MAX_ENUM} values.", at)
        if not all(_fits(v, kind) for v in enum):
            raise _bad(f"{name!r}: every enum value must be a {kind}.", at)
    if "maxLength" in spec:
        top = spec["maxLength"]
        if kind != "string" or not (isinstance(top, int) and not isinstance(top, bool)):
            raise _bad(f"{name!r}: maxLength is a whole number, for a string.", at)
        if not 1 <= top <= limits.PEOPLE_SCHEMA_MAX_STRING_CHARS:
            raise _bad(f"{name!r}: maxLength is 1 to {limits.PEOPLE_SCHEMA_MAX_STRING_CHARS}.", at)
    for bound in ("minimum", "maximum"):
        if bound in spec and (kind not in ("integer", "number") or not _is_number(spec[bound])):
            raise _bad(f"{name!r}: {bound} is a number, for an integer or number.", at)


def check_schema(schema: Any, *, at: str = "for.people.edit_schema") -> dict[str, Any]:
    """An edit schema, checked when the wait is made: InvalidTransitionInput names the field at fault."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise _bad('edit_schema must be {"type": "object", "properties": {...}}.', at)
    if unknown := sorted(set(schema) - _OBJECT_KEYWORDS):
        raise _bad(f"keyword {unknown[0]!r} is not supported (only {sorted(_OBJECT_KEYWORDS)}).", at)
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not 1 <= len(properties) <= limits.PEOPLE_SCHEMA_MAX_PROPERTIES:
        raise _bad(f"properties maps 1 to {limits.PEOPLE_SCHEMA_MAX_PROPERTIES} field names to schemas.", at)
    for name, spec in properties.items():
        if not (isinstance(name, str) and 1 <= len(name) <= _LABEL_MAX and name.isprintable()):
            raise _bad(f"a field name is 1 to {_LABEL_MAX} printable characters.", at)
        _check_field(name, spec, at)
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
        raise _bad("required lists names of properties.", at)
    return schema


def validate(value: Any, schema: dict[str, Any], *, at: str = "edited") -> dict[str, Any]:
    """Edited arguments against a checked schema: an object of the schema's fields only (none unknown),
    each of its type and within its bounds, the required ones present."""
    if not isinstance(value, dict):
        raise _bad("The edited arguments are an object.", at)
    properties: dict[str, dict[str, Any]] = schema["properties"]
    if unknown := sorted(set(value) - set(properties)):
        raise _bad(f"{unknown[0][:60]!r} is not a field of this edit.", at)
    for name in schema.get("required", []):
        if name not in value:
            raise _bad(f"{name!r} is required.", f"{at}.{name}")
    for name, field_value in value.items():
        spec = properties[name]
        kind = spec["type"]
        where = f"{at}.{name}"
        if not _fits(field_value, kind):
            raise _bad(f"{name!r} must be a {kind}.", where)
        if "enum" in spec and field_value not in spec["enum"]:
            raise _bad(f"{name!r} must be one of the listed values.", where)
        if kind == "string":
            top = spec.get("maxLength", limits.PEOPLE_SCHEMA_MAX_STRING_CHARS)
            if len(field_value) > top or "\x00" in field_value:
                raise _bad(f"{name!r} is at most {top} characters (no NUL).", where)
        if "minimum" in spec and field_value < spec["minimum"]:
            raise _bad(f"{name!r} must be at least {spec['minimum']}.", where)
        if "maximum" in spec and field_value > spec["maximum"]:
            raise _bad(f"{name!r} must be at most {spec['maximum']}.", where)
    return value
