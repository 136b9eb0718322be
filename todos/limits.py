"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

from django.conf import settings

# --- Waits (issue 28: what a wait may describe, who may resolve it, how many an agent keeps open) ---

# A wait's ``for`` as compact JSON: a todos list of 100 ids is about 3.8 KB, an event wait with a few match
# paths a few hundred bytes; it is copied into ``errors`` on every wait, so it stays small.
WAIT_FOR_MAX_BYTES = 4096
# One match value: a SHA, a customer or repository id, a branch name fit many times over.
WAIT_MATCH_VALUE_MAX_CHARS = 512
# ``resolvers``: who besides the token holder and operators may resolve a wait. A handful names a team;
# each is matched in the resolve statement's WHERE, so the list stays short.
WAIT_RESOLVERS_MAX = 20
# A resolver scope glob is a claim scope's shape; its wildcards are bounded like a claim pattern's.
WAIT_RESOLVER_WILDCARDS_MAX = 8
# A todo's ``errors`` keeps its last this many entries: every statement that appends drops older ones,
# so a todo that waits again and again (each wait gives its attempt back) cannot grow without bound.
ERRORS_KEPT = 100


def max_open_event_waits_per_agent() -> int:
    """Open event waits one agent may hold (429 beyond): each is probed by every delivery of its source."""
    return int(settings.MAX_OPEN_EVENT_WAITS_PER_AGENT)
