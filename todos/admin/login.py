"""The operator console's login, throttled (issue 28, L6): staff accounts hold every queue, so guessing
their passwords must not be free.

Failed logins are counted per user name and per client address in one small table
(todos.models.LoginThrottle). Past ``limits.admin_login_max_failures()`` for a name, or
``limits.admin_login_max_failures_per_address()`` from an address, within the lockout window, that name or
address is locked until the window ends: the form says so, and the password is not even checked, so a
locked account cannot be guessed at all and its answers say nothing about the password. A successful
login clears its name's count.

Why PostgreSQL and not a cache: the project has no shared cache (each process's would count alone, and a
restart would forget), and the rows are few and written only on failures.

The address is REMOTE_ADDR: behind a proxy, gunicorn's FORWARDED_ALLOW_IPS must name the proxy so that
uvicorn puts the client's address there (docs/deploy.md); otherwise every client shares the proxy's.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError
from django.db import connection
from django.http import HttpRequest

from todos import limits

# One failure for one key: a new window when the last has ended, else one more in it; at the limit the key
# is locked to the window's end. One upsert on the primary key; concurrent failures serialise on its row.
_RECORD_FAILURE = """
INSERT INTO todos_loginthrottle AS t (key, failures, window_started_at, locked_until)
VALUES (%(key)s, 1, now(), CASE WHEN %(limit)s <= 1 THEN now() + %(window)s * interval '1 second' END)
ON CONFLICT (key) DO UPDATE SET
    failures = CASE WHEN t.window_started_at < now() - %(window)s * interval '1 second' THEN 1
                    ELSE t.failures + 1 END,
    window_started_at = CASE WHEN t.window_started_at < now() - %(window)s * interval '1 second' THEN now()
                             ELSE t.window_started_at END,
    locked_until = CASE
        WHEN t.window_started_at < now() - %(window)s * interval '1 second' THEN
            CASE WHEN %(limit)s <= 1 THEN now() + %(window)s * interval '1 second' END
        WHEN t.failures + 1 >= %(limit)s THEN now() + %(window)s * interval '1 second'
        ELSE t.locked_until END
"""

# Seconds until the later lockout of these keys ends (NULL: none is locked). Primary-key lookups.
_LOCKED_FOR = """
SELECT ceil(extract(epoch FROM max(locked_until) - now()))::int
FROM todos_loginthrottle WHERE key = ANY(%(keys)s) AND locked_until > now()
"""

# Rows whose window and lockout have both ended count nothing: a few are deleted at each failure (through
# the index on window_started_at), so names and addresses tried once do not pile up.
_FORGET_ENDED = """
DELETE FROM todos_loginthrottle WHERE key IN (
    SELECT key FROM todos_loginthrottle
    WHERE window_started_at < now() - %(window)s * interval '1 second'
      AND (locked_until IS NULL OR locked_until < now())
    LIMIT 100
)
"""


def _keys(username: str, address: str) -> dict[str, int]:
    """Each key counted for this attempt, with its limit."""
    keys = {f"user:{username.strip().lower()[:250]}": limits.admin_login_max_failures()}
    if address:
        keys[f"addr:{address[:250]}"] = limits.admin_login_max_failures_per_address()
    return keys


def locked_for(username: str, address: str) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(_LOCKED_FOR, {"keys": list(_keys(username, address))})
        row = cursor.fetchone()
    return row[0] if row and row[0] is not None else None


def record_failure(username: str, address: str) -> None:
    window = limits.admin_login_lockout_seconds()
    with connection.cursor() as cursor:
        for key, limit in _keys(username, address).items():
            cursor.execute(_RECORD_FAILURE, {"key": key, "limit": limit, "window": window})
        cursor.execute(_FORGET_ENDED, {"window": window})


def record_success(username: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos_loginthrottle WHERE key = %s", [f"user:{username.strip().lower()[:250]}"])


def client_address(request: HttpRequest | None) -> str:
    return str(request.META.get("REMOTE_ADDR", "")) if request is not None else ""


class ThrottledAdminLoginForm(AdminAuthenticationForm):
    """The admin's login form, refusing a locked name or address before it checks any password."""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "locked": (
            "Too many failed logins for this account or from this address. Logins are locked for about "
            "%(minutes)s more minute(s); try again then, or ask another administrator."
        ),
    }

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        seconds = locked_for(username, address)
        if seconds is not None:
            raise ValidationError(
                self.error_messages["locked"], code="locked", params={"minutes": max(1, -(-seconds // 60))}
            )
        try:
            cleaned = super().clean()
        except ValidationError as refused:
            if username and self.cleaned_data.get("password"):
                record_failure(username, address)
            raise refused
        record_success(username)
        return cleaned
