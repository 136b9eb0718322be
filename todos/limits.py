"""Every bound the service enforces, in one place (issue 34).

Serializers, the queue service, MCP schemas and the API descriptions read these names; none restates a
number. A bound an operator may tune reads its setting here (settings.py documents the variable), so the
rest of the code never reaches into settings for a limit.
"""

from __future__ import annotations

from django.conf import settings

# --- Per-agent budgets of server resources (issue 28, M3) -------------------------------------------
# Each is read on every use, so a test (or a settings override) changes it at once. All are per web
# process: todos/budgets.py says why.


def max_waits_per_agent() -> int:
    """Long-polls and awaits one agent may have open in one process (AGENT_MAX_WAITS, default 100: a
    worker fleet sharing one token runs tens of long-polls; a hundred leaves room, while 10,000 of them
    would cost the process's wake-ups and the awaits' shared read). 0: no cap."""
    return int(settings.AGENT_MAX_WAITS)


def agent_rate_per_second() -> float:
    """Requests a second per agent token and process (AGENT_RATE_PER_SECOND, default 1000: far above a
    worker's pace, about what one process serves, so one token cannot take a process alone). 0: off."""
    return float(settings.AGENT_RATE_PER_SECOND)


def agent_rate_burst() -> int:
    """The token bucket's size (AGENT_RATE_BURST, default 2000: two seconds at the default rate)."""
    return max(1, int(settings.AGENT_RATE_BURST))


def answer_page_max_bytes() -> int:
    """Bytes of rendered todos one list answer carries before it stops early (API_PAGE_MAX_BYTES, default
    4 MiB, read by switchboard/api.py's pagination too: a page of 100 whole todos could be 100 MB; 4 MiB is
    thousands of ordinary todos' worth and a bounded cost per request)."""
    return int(settings.API_PAGE_MAX_BYTES)


# Seconds a client refused for too many open waits is told to wait (Retry-After): a wait lasts at most
# 20 s, and most end sooner, when work comes.
WAIT_SLOT_RETRY_AFTER_SECONDS = 1


# --- The operator console's login (issue 28, L6) -------------------------------------------------------


def admin_login_max_failures() -> int:
    """Failed logins to one user name before it is locked (ADMIN_LOGIN_MAX_FAILURES, default 5: a person
    mistypes a password two or three times; a guesser needs millions of tries, and gets 5 a lockout)."""
    return max(1, int(settings.ADMIN_LOGIN_MAX_FAILURES))


def admin_login_max_failures_per_address() -> int:
    """Failed logins from one client address, whatever the names (ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS,
    default 30: several people behind one office NAT, each mistyping; a sprayer of names is stopped)."""
    return max(1, int(settings.ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS))


def admin_login_lockout_seconds() -> int:
    """How long failures are counted, and how long a lockout lasts (ADMIN_LOGIN_LOCKOUT_SECONDS, default
    900: 15 minutes caps a guesser at 5 tries a quarter hour per name, and a locked-out person waits little)."""
    return max(1, int(settings.ADMIN_LOGIN_LOCKOUT_SECONDS))
