"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

# --- Batches (the queue service enforces them; the API's serializers and the client read them here) ---
MAX_CLAIM_BATCH = 100  # todos one claim may take: a worker's batch, bounded so one answer stays small
MAX_CREATE_BATCH = 1000  # todos one batch create may insert: one statement, about 0.1 s (docs/benchmarks.md)
MAX_COMPLETE_BATCH = 100  # completions one batch complete may carry: one statement, each result up to the payload bound
