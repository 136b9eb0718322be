"""Outbound notices (issue 29): what Switchboard tells people and producers, delivered as todos of its own.

A caller (a wait for people, a reminder, a todo's ``callback``) builds a :class:`Notice` and calls
:func:`notify_users` or :func:`notify_url` inside its own transaction. Each delivery (one per channel per
recipient) is a todo in the system queue ``_switchboard.notify`` (:data:`NOTIFY_QUEUE`), which no agent
scope reaches; ``manage.py notify`` claims them, sends them (todos/outbound.py) and completes or fails
them, so the queue's own leases, retries with backoff and dead-letters apply, and the admin shows them.

The delivery todo's payload names its channel:

- ``{"channel": "webhook", "endpoint": <NotifyEndpoint id>, "notice": {...}}``: signed with the endpoint's
  secret, read when it is sent (a revoked or deactivated endpoint sends nothing);
- ``{"channel": "email", "user": <user id>, "to": address, "notice": {...}}``;
- ``{"channel": "url", "url": ..., "secret": ..., "notice": {...}}`` (notify_url: a callback).

Every outbound URL passes :func:`check_outbound_url` at input time and again, on every hop, when it is sent.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings

from todos.errors import InvalidTransitionInput
from todos.limits import OUTBOUND_MAX_URL_CHARS, notify_max_attempts

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, Group

    User = AbstractBaseUser
else:
    User = Any
    Group = Any

# The system queue of deliveries. Its leading "_" is outside QUEUE_NAME_RE, so no agent can create into it,
# and agents' scope globs never match a name starting with "_" unless the glob itself does
# (todos/models.py, Agent.*_like_patterns).
NOTIFY_QUEUE = "_switchboard.notify"

__all__ = [
    "NOTIFY_QUEUE",
    "Notice",
    "Pinned",
    "check_outbound_url",
    "notify_url",
    "notify_users",
    "vet_outbound_url",
]


@dataclass(frozen=True)
class Notice:
    """One thing to tell people (or a producer). ``key`` makes it idempotent: the same key, recipient and
    channel enqueue one delivery while it is unsent (a retried caller sends once)."""

    key: str  # e.g. f"wait:{todo_id}:asked"
    event: str  # e.g. "wait.asked", "wait.reminder", "wait.escalated", "todo.done"
    subject: str  # one line
    text: str  # plain text (markdown source), already bounded by the caller
    links: dict[str, str] = field(default_factory=dict)  # name -> absolute URL, e.g. {"approve": ..., "open": ...}
    data: dict[str, Any] = field(default_factory=dict)  # JSON for webhook receivers

    def as_json(self, links: dict[str, str] | None = None) -> dict[str, Any]:
        body = asdict(self)
        if links is not None:
            body["links"] = links
        return body


# --- The SSRF guard ---


@dataclass(frozen=True)
class Pinned:
    """A URL the guard let through, with the addresses its host resolved to: the sender connects to one of
    these, never resolving the name again (no DNS rebinding between the check and the connect)."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def _refused_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and (ip.ipv4_mapped or ip.sixtofour):
        mapped = ip.ipv4_mapped or ip.sixtofour
        assert mapped is not None
        ip = mapped
    return not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified


def vet_outbound_url(url: str, *, field: str) -> Pinned:
    """The guard itself: ``url`` must be http(s) with a host, and every address that host resolves to must
    be public (not private, loopback, link-local, reserved, multicast or unspecified) unless
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS, or the URL's ``host:port`` is one of
    settings.OUTBOUND_ALLOW_HOSTS (an operator's internal bridge, exactly). Raises InvalidTransitionInput (a
    400 naming ``field``)."""

    def refuse(why: str) -> InvalidTransitionInput:
        return InvalidTransitionInput(why, field=field)

    if not isinstance(url, str) or not url or len(url) > OUTBOUND_MAX_URL_CHARS:
        raise refuse(f"Give an http or https URL of at most {OUTBOUND_MAX_URL_CHARS} characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise refuse(f"Not a URL: {exc}.") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise refuse("Only http and https URLs are allowed.")
    host = parts.hostname
    if not host or any(c in url for c in "\r\n\x00 "):
        raise refuse("The URL needs a host, and no spaces or control characters.")
    if port is None:
        port = 443 if scheme == "https" else 80
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise refuse(f"The host {host!r} does not resolve.") from exc
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise refuse(f"The host {host!r} does not resolve.")
    if not settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS and f"{host}:{port}" not in settings.OUTBOUND_ALLOW_HOSTS:
        for address in addresses:
            if _refused_address(address):
                raise refuse(
                    f"The host {host!r} resolves to {address}, a private, loopback, link-local or reserved "
                    "address: outbound requests go to public addresses only."
                )
    return Pinned(url=url, scheme=scheme, host=host, port=port, addresses=addresses)


def check_outbound_url(url: str, *, field: str) -> None:
    """The SSRF guard at input time: a 400 naming ``field`` for a URL that is not http(s) or that resolves
    to a non-public address (see vet_outbound_url). The sender checks again on every hop."""
    vet_outbound_url(url, field=field)


# --- Enqueueing ---


def _enqueue(items: list[dict[str, Any]]) -> list[str]:
    from todos import queue

    if not items:
        return []
    for item in items:
        item.setdefault("queue", NOTIFY_QUEUE)
        item.setdefault("max_attempts", notify_max_attempts())
    outcomes = queue.create_many(items)
    return [ref.id for ref, _ in outcomes]


def _item(kind: str, title: str, key: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "title": title[:500], "idempotency_key": key[:300], "payload": payload}


def notify_users(
    *,
    users: Iterable[User],
    groups: Iterable[Group] = (),
    notice: Notice,
    links_for: Callable[[User], dict[str, str]] | None = None,
) -> list[str]:
    """In the caller's transaction: enqueue one delivery todo per channel per recipient, and return their
    ids. Channels: each active NotifyEndpoint of each user and of each group whose ``events`` want
    ``notice.event`` (a group's endpoint gets the notice once), and an email to each user with an address,
    the groups' active members included (each person once). ``links_for(user)``, if given, replaces
    ``notice.links`` in that user's email and in the webhooks to that user's own endpoints (per-person
    signed links; called once per person); a group's endpoint gets ``notice.links``.
    Idempotent per (notice.key, recipient, channel): the delivery's idempotency key is
    ``notify:<notice.key>:<channel>:<recipient>``, held while the delivery is unsent."""
    from django.contrib.auth import get_user_model

    from todos.models import NotifyEndpoint

    user_list = list(users)
    group_list = list(groups)
    people: dict[Any, Any] = {u.pk: u for u in user_list}
    if group_list:
        members = get_user_model().objects.filter(groups__in=group_list, is_active=True).distinct()
        for member in members:
            people.setdefault(member.pk, member)
    items: list[dict[str, Any]] = []
    links_of: dict[Any, dict[str, str]] = {}

    def links(person: Any) -> dict[str, str] | None:
        if links_for is None:
            return None
        if person.pk not in links_of:
            links_of[person.pk] = links_for(person)
        return links_of[person.pk]

    endpoints = NotifyEndpoint.objects.filter(active=True, user_id__in=[u.pk for u in user_list]) | (
        NotifyEndpoint.objects.filter(active=True, group__in=group_list)
    )
    for endpoint in endpoints.order_by("id"):
        if not endpoint.wants(notice.event):
            continue
        own = links(people[endpoint.user_id]) if endpoint.user_id is not None else None
        items.append(
            _item(
                "notify.webhook",
                f"{notice.event} to endpoint {endpoint.pk}: {notice.subject}",
                f"notify:{notice.key}:webhook:{endpoint.pk}",
                {"channel": "webhook", "endpoint": endpoint.pk, "notice": notice.as_json(own)},
            )
        )
    for pk, person in sorted(people.items(), key=lambda kv: str(kv[0])):
        address = getattr(person, "email", "") or ""
        if not address or not getattr(person, "is_active", True):
            continue
        items.append(
            _item(
                "notify.email",
                f"{notice.event} to {person.get_username()}: {notice.subject}",
                f"notify:{notice.key}:email:{pk}",
                {"channel": "email", "user": pk, "to": address, "notice": notice.as_json(links(person))},
            )
        )
    return _enqueue(items)


def notify_url(
    *,
    url: str,
    secret: str,
    notice: Notice,
    body: dict[str, Any] | None = None,
    msg_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> str:
    """In the caller's transaction: enqueue one signed webhook of ``notice`` to ``url`` (already checked by
    check_outbound_url; the sender checks it again on every hop), signed with ``secret`` (a ``whsec_``
    Standard Webhooks secret): a todo's callback, or an agent's subscription. Returns the delivery's id;
    idempotent per (notice.key, url). ``body``, ``msg_id`` and ``headers``: an MCP Events delivery's own
    body, webhook-id and X-MCP-Subscription-Id (todos/event_feed.py); it then follows no redirect."""
    import hashlib

    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return _enqueue(
        [
            _item(
                "notify.url",
                f"{notice.event}: {notice.subject}",
                f"notify:{notice.key}:url:{digest}",
                {
                    "channel": "url",
                    "url": url,
                    "secret": secret,
                    "notice": notice.as_json(),
                    **({"body": body} if body is not None else {}),
                    **({"msg_id": msg_id} if msg_id is not None else {}),
                    **({"headers": headers} if headers is not None else {}),
                },
            )
        ]
    )[0]
