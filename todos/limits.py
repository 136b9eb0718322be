"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

from django.conf import settings

# --- Scope patterns, queues per create scope, fair_weights (issue 28: H1, M4, L7) -------------------------
# Wildcards (* and ?, runs of * counted once) in one scope or claim glob. Matching is linear whatever
# the count (todos/globs.py); the bound keeps the SQL LIKE patterns and each match's work small, and real
# scopes use one or two (github.*, jobs.*.high).
MAX_SCOPE_WILDCARDS = 8
# Keys in one queue's fair_weights. Every fair claim reads the whole object (todos/sql/claim.py), and keys
# beyond the tenants a queue really weighs are a producer's Sybil keys, not configuration.
MAX_FAIR_WEIGHTS_KEYS = 1000


def max_queues_per_create_scope() -> int:
    """Queues that may exist under one glob create scope before an agent may add no more through it
    (MAX_QUEUES_PER_CREATE_SCOPE, default 1000). Every queue costs each claim whose scopes cover it an index
    descent, and GET /queues/, the dashboard and /metrics a row each; a thousand is far more than a real
    fan-out of queue names (one per repository, per customer tier) and small enough to keep those cheap.
    Existing queues, exact-name scopes, staff and the system (routes, schedules) are never limited."""
    return int(settings.MAX_QUEUES_PER_CREATE_SCOPE)
