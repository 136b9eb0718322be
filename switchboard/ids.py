"""Record ids: a two-letter kind, an underscore and 32 lowercase hex digits (a random UUID's hex), e.g.
``td_6f1c2d0e9a7b4c3d8e5f60718293a4b5`` for a todo and ``ev_…`` for an event.

Lookups check the shape first: a value of another shape cannot be a stored id, so it is answered as
not found without a query (and a NUL byte, which PostgreSQL refuses mid-statement, never reaches one).
"""

from __future__ import annotations

import re
import uuid

TODO = "td"
EVENT = "ev"

_ID_RE = re.compile(r"(?P<kind>[a-z]{2})_[0-9a-f]{32}")


def new_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


def is_id(value: str, kind: str) -> bool:
    """Whether ``value`` has the shape of an id of this kind (not whether one exists)."""
    match = _ID_RE.fullmatch(value)
    return match is not None and match["kind"] == kind
