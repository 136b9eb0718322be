"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

# --- Request bodies and JSON nesting (issue 28: bounded bodies, deep nesting) -----------------------
# How deep a JSON value taken from a caller (a payload, a result, a checkpoint, a wait's resolution data)
# may nest. Real documents nest about 10 levels (GitHub's webhooks); Python's recursion limit is 1,000
# frames, and every later encoding of the value (jsonb, the response, an MCP result) recurses once per
# level from wherever it runs: a value accepted at depth 900 by the serializer failed, as a 500, in
# psycopg's encoder a few frames further down. A tenth of the limit leaves every encoder room.
MAX_JSON_DEPTH = 100
