"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

# --- Scope patterns, queues per create scope, fair_weights (issue 28: H1, M4, L7) -------------------------
# Wildcards (* and ?, runs of * counted once) in one scope or claim glob. Matching is linear whatever
# the count (todos/globs.py); the bound keeps the SQL LIKE patterns and each match's work small, and real
# scopes use one or two (github.*, jobs.*.high).
MAX_SCOPE_WILDCARDS = 8
# Keys in one queue's fair_weights. Every fair claim reads the whole object (todos/sql/claim.py), and keys
# beyond the tenants a queue really weighs are a producer's Sybil keys, not configuration.
MAX_FAIR_WEIGHTS_KEYS = 1000
