"""Signed decision links (issue 29): ``/decide/<todo_id>/?t=<token>``.

A link is bound to one wait (the todo and the wait's created_at) and one person, expires
(limits.decision_link_ttl_seconds(), never past the wait's timeout), and is spent on its first use: the
token's 256 random bits are the credential, only their SHA-256 is stored (DecisionLink). Spending it gives
the browser a session flag for that one todo and that person (todos/people/views.py), not a login: a
forwarded link is useless to anyone else once used, and it opens no other page.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.utils import timezone

from todos import limits, sql
from todos.models import DecisionLink, hash_token
from todos.rows import fetchall

TOKEN_PREFIX = "dl_"  # noqa: S105 (a prefix, not a secret)
TOKEN_MAX_CHARS = 100


def decide_path(todo_id: str) -> str:
    return f"/decide/{quote(todo_id)}/"


def page_url(todo_id: str) -> str:
    """The decision page without a token: behind the login (for webhooks and anyone forwarded a notice)."""
    return str(settings.PUBLIC_URL) + decide_path(todo_id)


def inbox_url() -> str:
    return str(settings.PUBLIC_URL) + "/inbox/"


def issue(*, todo_id: str, wait_created_at: datetime, timeout_at: datetime, user: Any) -> str:
    """A new signed link for ``user`` to decide this wait (in the caller's transaction); returns its URL."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires = min(timezone.now() + timedelta(seconds=limits.decision_link_ttl_seconds()), timeout_at)
    DecisionLink.objects.create(
        token_hash=hash_token(token),
        todo_id=todo_id,
        wait_created_at=wait_created_at,
        user_id=user.pk,
        expires_at=expires,
    )
    return f"{page_url(todo_id)}?t={token}"


def _well_formed(token: str) -> bool:
    return isinstance(token, str) and token.startswith(TOKEN_PREFIX) and len(token) <= TOKEN_MAX_CHARS


def usable(todo_id: str, token: str) -> bool:
    """Whether ``spend`` would take this link now (a read: a link's GET spends nothing)."""
    if not _well_formed(token):
        return False
    return bool(fetchall(sql.USABLE_LINK, {"hash": hash_token(token), "id": todo_id}))


def spend(todo_id: str, token: str) -> int | None:
    """The user a link was made for, if it is this todo's, unspent, unexpired and for its open wait; it is
    spent by this call (exactly one of two concurrent uses gets the user). None otherwise, whatever the
    reason: a link's holder learns nothing more."""
    if not _well_formed(token):
        return None
    rows = fetchall(sql.SPEND_LINK, {"hash": hash_token(token), "id": todo_id})
    return int(rows[0][0]) if rows else None
