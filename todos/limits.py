"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

from django.conf import settings

# --- Webhooks and input checks (issue 28: ingest) ---------------------------------------------------


def ingest_replay_window_seconds() -> int:
    """How long a body-only-signed delivery's body is remembered (settings.INGEST_REPLAY_WINDOW_SECONDS,
    30 days): a capture resent with a fresh delivery id inside it is a duplicate. Ten times GitHub's
    3-day redelivery horizon, and the check is one index probe per delivery whatever the window, so the
    only cost of a long one is a legitimate identical body (in practice a repeated GitHub ping) being
    answered as the first."""
    return int(settings.INGEST_REPLAY_WINDOW_SECONDS)


# Signature timestamps (Stripe's t=, Standard Webhooks' and plain HMAC's): a Unix time in seconds has 10
# digits until 2286; 12 leaves room, and keeps int() away from inputs thousands of digits long.
MAX_TIMESTAMP_DIGITS = 12
