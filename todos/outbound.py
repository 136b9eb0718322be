"""Sending a delivery todo of the system queue (issue 29; enqueued by todos/notices.py, run by manage.py notify).

Webhooks follow the Standard Webhooks spec: a POST of the JSON body with ``webhook-id`` (the delivery todo's
id: the same on every retry, so a receiver can drop duplicates), ``webhook-timestamp`` (Unix seconds) and
``webhook-signature`` (``v1,`` and the base64 HMAC-SHA256 of ``id.timestamp.body`` under the secret's
base64-decoded bytes). The receiver verifies it with any Standard Webhooks library.

The request goes only where the SSRF guard allows (todos/notices.py, vet_outbound_url), and to the very
address the guard resolved: the connection is made to that IP, with the name in the Host header and as TLS
SNI (certificates are still checked against the name). Redirects are followed here, at most
OUTBOUND_MAX_REDIRECTS, each hop vetted and pinned again; the body is re-sent on each (a webhook is a POST).
No proxy from the environment is used (it would connect to a name the guard never saw).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import certifi
import httpx
from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.utils.html import format_html, format_html_join

from todos.errors import InvalidTransitionInput
from todos.limits import (
    OUTBOUND_CONNECT_TIMEOUT_SECONDS,
    OUTBOUND_MAX_BODY_BYTES,
    OUTBOUND_MAX_REDIRECTS,
    OUTBOUND_MAX_RESPONSE_BYTES,
    OUTBOUND_TIMEOUT_SECONDS,
)
from todos.notices import Pinned, vet_outbound_url

USER_AGENT = "Switchboard-Webhooks/1"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class DeliveryFailed(Exception):
    """A send that did not succeed: its message becomes the delivery todo's error (a retry, or at the cap a
    dead-letter). ``permanent``: retrying cannot help (the endpoint is gone); the todo is still failed, so
    an operator sees why."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


# --- Signing ---


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature header's value for one message."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, to_sign, hashlib.sha256).digest()).decode()


def signed_headers(
    secret: str, msg_id: str, body: bytes, *, timestamp: int | None = None, also: tuple[str, ...] = ()
) -> dict[str, str]:
    """The Standard Webhooks headers; ``also``: more secrets to sign under, space-delimited in one
    ``webhook-signature`` (the spec's multi-signature: a receiver accepts if any verifies), e.g. the secret a
    rotation replaced, during its grace window."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(sign(s, msg_id, ts, body) for s in dict.fromkeys((secret, *also))),
    }


# --- HTTP ---


@dataclass(frozen=True)
class Sent:
    status: int
    url: str  # the last hop's URL
    hops: int
    body: bytes = b""  # the answer, at most OUTBOUND_MAX_RESPONSE_BYTES (MCP Events' verification echo)


def _pinned_url(pinned: Pinned, address: str) -> str:
    parts = urlsplit(pinned.url)
    host = f"[{address}]" if ":" in address else address
    return urlunsplit((pinned.scheme, f"{host}:{pinned.port}", parts.path or "/", parts.query, ""))


def _host_header(pinned: Pinned) -> str:
    host = f"[{pinned.host}]" if ":" in pinned.host else pinned.host
    default = 443 if pinned.scheme == "https" else 80
    return host if pinned.port == default else f"{host}:{pinned.port}"


def _post_pinned(
    client: httpx.Client, pinned: Pinned, body: bytes, headers: dict[str, str], deadline: float
) -> httpx.Response:
    """POST to the guard's addresses in turn (the first that connects), never resolving the name again."""
    last: Exception | None = None
    for address in pinned.addresses:
        request = client.build_request(
            "POST",
            _pinned_url(pinned, address),
            content=body,
            headers={**headers, "host": _host_header(pinned)},
            extensions={"sni_hostname": pinned.host},
        )
        try:
            response = client.send(request, stream=True)
        except httpx.ConnectError as exc:
            last = exc
            continue
        try:
            response.read() if _short(response) else _read_bounded(response, deadline)
        finally:
            response.close()
        return response
    raise DeliveryFailed(f"could not connect to {pinned.host}: {last}")


def _short(response: httpx.Response) -> bool:
    length = response.headers.get("content-length")
    return length is not None and length.isdigit() and int(length) <= OUTBOUND_MAX_RESPONSE_BYTES


def _read_bounded(response: httpx.Response, deadline: float) -> None:
    """Read at most OUTBOUND_MAX_RESPONSE_BYTES of a receiver's answer (the rest is dropped with the
    connection), until the send's deadline: an endless or dripping answer cannot hold the sender."""
    taken = bytearray()
    for chunk in response.iter_raw():
        taken += chunk
        if len(taken) >= OUTBOUND_MAX_RESPONSE_BYTES or time.monotonic() > deadline:
            break
    response._content = bytes(taken[:OUTBOUND_MAX_RESPONSE_BYTES])


def _tls() -> ssl.SSLContext:
    """Certificates are checked against the URL's name (sent as SNI), whatever address is connected to; the
    system's CAs, or settings.OUTBOUND_CA_BUNDLE's (an internal CA for an internal bridge)."""
    return ssl.create_default_context(cafile=settings.OUTBOUND_CA_BUNDLE or certifi.where())


def post_webhook(
    url: str,
    secret: str,
    msg_id: str,
    payload: Any,
    *,
    field: str = "url",
    extra_headers: dict[str, str] | None = None,
    redirects: int = OUTBOUND_MAX_REDIRECTS,
    final: tuple[int, ...] = (),
    also_secrets: tuple[str, ...] = (),
) -> Sent:
    """Send one signed webhook; raises DeliveryFailed unless the (last) answer is 2xx. ``extra_headers`` are
    sent beside the signature's (MCP Events' X-MCP-Subscription-Id); ``redirects``: hops followed at most
    (0 for MCP Events, whose sketch forbids following one); ``final``: statuses that end the delivery
    without a retry (MCP Events' 410 Gone and 413: the receiver declined it), returned, not raised;
    ``also_secrets``: more secrets to sign under (a rotation's grace window)."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > OUTBOUND_MAX_BODY_BYTES:
        raise DeliveryFailed(f"body of {len(body)} bytes is over {OUTBOUND_MAX_BODY_BYTES}", permanent=True)
    headers = {**(extra_headers or {}), **signed_headers(secret, msg_id, body, also=also_secrets)}
    timeout = httpx.Timeout(OUTBOUND_TIMEOUT_SECONDS, connect=OUTBOUND_CONNECT_TIMEOUT_SECONDS)
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False, verify=_tls()) as client:
        current = url
        deadline = time.monotonic() + OUTBOUND_TIMEOUT_SECONDS
        for hop in range(redirects + 1):
            if time.monotonic() > deadline:
                raise DeliveryFailed(f"no answer within {OUTBOUND_TIMEOUT_SECONDS:g} s (after {hop} redirects)")
            try:
                pinned = vet_outbound_url(current, field=field)
            except InvalidTransitionInput as exc:
                where = "" if hop == 0 else f" (redirect {hop})"
                raise DeliveryFailed(f"refused{where}: {current}: {exc.detail}", permanent=True) from exc
            try:
                response = _post_pinned(client, pinned, body, headers, deadline)
            except httpx.HTTPError as exc:
                raise DeliveryFailed(f"{type(exc).__name__} from {pinned.host}: {exc}") from exc
            location = response.headers.get("location")
            if response.status_code in _REDIRECTS and location:
                current = urljoin(current, location)
                continue
            if 200 <= response.status_code < 300 or response.status_code in final:
                return Sent(response.status_code, current, hop, response.content)
            snippet = response.content[:200].decode("utf-8", "replace")
            raise DeliveryFailed(f"HTTP {response.status_code} from {pinned.host}: {snippet}")
    raise DeliveryFailed(f"more than {redirects} redirects")


# --- Email ---


def _safe_links(links: dict[str, str]) -> list[tuple[str, str]]:
    return [
        (str(name), str(url))
        for name, url in links.items()
        if isinstance(url, str) and urlsplit(url).scheme in ("http", "https")
    ]


def send_email(to: str, notice: dict[str, Any]) -> None:
    """A plain-text mail with the notice's text and links, and a simple HTML part: the text escaped, the
    links as buttons (only http(s) links are shown)."""
    links = _safe_links(notice.get("links") or {})
    subject = " ".join(str(notice.get("subject", "")).split())[:200] or "Switchboard"
    text = str(notice.get("text", ""))
    plain = text + ("\n\n" + "\n".join(f"{name}: {url}" for name, url in links) if links else "") + "\n"
    buttons = format_html_join(
        "",
        '<a href="{}" style="display:inline-block;margin:4px 8px 4px 0;padding:10px 16px;border-radius:6px;'
        'background:#1f6feb;color:#fff;text-decoration:none;font-weight:600">{}</a>',
        ((url, name.replace("_", " ").capitalize()) for name, url in links),
    )
    html = format_html(
        '<!doctype html><html><body style="font-family:system-ui,sans-serif;max-width:40em">'
        '<h2 style="font-size:1.1em">{}</h2><div style="white-space:pre-wrap">{}</div><p>{}</p></body></html>',
        subject,
        text,
        buttons,
    )
    mail = EmailMultiAlternatives(subject, plain, settings.DEFAULT_FROM_EMAIL, [to])
    mail.attach_alternative(html, "text/html")
    try:
        mail.send()
    except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors
        raise DeliveryFailed(f"email to {to}: {type(exc).__name__}: {exc}") from exc


# --- A delivery todo ---


def deliver(todo_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Send the delivery ``payload`` describes (todos/notices.py). Returns the result to complete it with;
    raises DeliveryFailed."""
    from todos.models import NotifyEndpoint

    channel = payload.get("channel")
    notice = payload.get("notice") or {}
    if channel == "email":
        send_email(str(payload["to"]), notice)
        return {"channel": "email", "to": payload["to"]}
    if channel == "webhook":
        endpoint = NotifyEndpoint.objects.filter(pk=int(payload.get("endpoint") or 0)).first()
        if endpoint is None or not endpoint.active:
            raise DeliveryFailed("the endpoint was deleted or deactivated", permanent=True)
        sent = post_webhook(endpoint.url, endpoint.secret, todo_id, _webhook_body(todo_id, notice))
        return {"channel": "webhook", "endpoint": endpoint.pk, "status": sent.status, "hops": sent.hops}
    if channel == "url":
        # An MCP Events delivery (todos/event_feed.py) carries its own body (an EventOccurrence), webhook-id
        # (the eventId) and headers, and follows no redirect; a callback notice gets {type, timestamp, data}.
        body = payload["body"] if isinstance(payload.get("body"), dict) else _webhook_body(todo_id, notice)
        extra = payload.get("headers") if isinstance(payload.get("headers"), dict) else None
        if extra is not None:
            return _event_delivery(todo_id, payload, body, extra)
        sent = post_webhook(str(payload["url"]), str(payload["secret"]), todo_id, body)
        return {"channel": "url", "status": sent.status, "hops": sent.hops}
    if channel == "callback":
        return _callback(todo_id, payload)
    if channel == "a2a":
        return _a2a_push(todo_id, payload)
    raise DeliveryFailed(f"unknown channel {channel!r}", permanent=True)


def _callback(delivery_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A todo's callback (enqueued by the trigger todo_enqueues_callback): the todo's JSON as the API shows it
    now, signed with its creating agent's webhook_secret."""
    from todos.api.serializers import TodoSerializer
    from todos.models import Agent, Todo

    secret = Agent.objects.filter(name=str(payload.get("agent"))).values_list("webhook_secret", flat=True).first()
    if not secret:
        raise DeliveryFailed("the creating agent is gone or has no webhook_secret", permanent=True)
    todo = Todo.objects.filter(pk=str(payload.get("todo"))).first()
    data: dict[str, Any] = dict(TodoSerializer(todo).data) if todo is not None else {"id": payload.get("todo")}
    if len(json.dumps(data, default=str)) > OUTBOUND_MAX_BODY_BYTES - 1024:
        # Too big to send whole (a large payload or result): the receiver GETs the todo for them.
        data = {**data, "payload": None, "result": None, "dependencies": None, "truncated": True}
    body = {
        "type": str(payload.get("event", "")),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "data": data,
    }
    sent = post_webhook(str(payload["url"]), secret, delivery_id, body, field="callback.url")
    return {"channel": "callback", "todo": payload.get("todo"), "status": sent.status, "hops": sent.hops}


def _event_delivery(
    delivery_id: str, payload: dict[str, Any], body: dict[str, Any], headers: dict[str, Any]
) -> dict[str, Any]:
    """An MCP Events webhook delivery: signed under its subscription's secrets as they are now (the new and,
    in a rotation's grace window, the old one; the delivery's own when the subscription is gone, e.g. a
    ``terminated`` envelope), no redirect followed, 410 and 413 final. Each attempt's outcome is recorded on
    the subscription (event_feed.record_delivery): enough consecutive failures suspend it."""
    from todos import event_feed
    from todos.models import EventSubscription

    subscription_id = str(headers.get("X-MCP-Subscription-Id", ""))
    row = EventSubscription.objects.filter(pk=subscription_id).first() if subscription_id else None
    secrets = row.signing_secrets(event_feed.db_now()) if row is not None else [str(payload["secret"])]
    try:
        sent = post_webhook(
            str(payload["url"]),
            secrets[0],
            str(payload.get("msg_id") or delivery_id),
            body,
            extra_headers={str(k): str(v) for k, v in headers.items()},
            redirects=0,
            final=(410, 413),
            also_secrets=tuple(secrets[1:]),
        )
    except DeliveryFailed as exc:
        if row is not None:
            event_feed.record_delivery(row.pk, event_feed.failure_reason(str(exc)))
        raise
    if row is not None:
        event_feed.record_delivery(row.pk, None if sent.status < 300 else "http_4xx")
    return {"channel": "url", "status": sent.status, "hops": sent.hops}


def _a2a_push(delivery_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """An A2A push notification (enqueued by the trigger todo_enqueues_a2a_push; todos/a2a/push.py): the
    task's StreamResponse as it is now, with the config's token and Authorization, signed with the agent's
    webhook_secret too. It follows no redirect: the credentials go to the URL the client gave, nowhere else.
    A config deleted since, a todo purged, or a change overtaken by a later one (the todo's state is no
    longer the one the trigger recorded) sends nothing."""
    from todos.a2a import push
    from todos.models import A2APushConfig, Agent, Todo

    config = A2APushConfig.objects.filter(pk=int(payload.get("config") or 0)).first()
    todo = Todo.objects.filter(pk=str(payload.get("todo"))).first()
    if config is None or todo is None:
        return {"channel": "a2a", "todo": payload.get("todo"), "skipped": "the config or the task is gone"}
    if todo.state != payload.get("state"):
        # Overtaken by a later change, whose own delivery carries the newer state: a receiver never gets a
        # stale state after a newer one, nor the same final task twice.
        return {"channel": "a2a", "todo": todo.id, "skipped": f"superseded by {todo.state}"}
    secret = Agent.objects.filter(pk=config.agent_id).values_list("webhook_secret", flat=True).first()
    if not secret:
        raise DeliveryFailed("the agent that added the config is gone or has no webhook_secret", permanent=True)
    headers: dict[str, str] = {}
    if config.token:
        headers["X-A2A-Notification-Token"] = config.token
    if config.auth_scheme and config.auth_credentials:
        headers["Authorization"] = f"{config.auth_scheme} {config.auth_credentials}"
    body = push.body_of(todo)
    sent = post_webhook(config.url, secret, delivery_id, body, field="url", extra_headers=headers, redirects=0)
    return {"channel": "a2a", "todo": todo.id, "config": config.config_id, "status": sent.status}


def _webhook_body(todo_id: str, notice: dict[str, Any]) -> dict[str, Any]:
    """A notice as a webhook receiver gets it, in Standard Webhooks' recommended shape {type, timestamp,
    data}. A todo's callback (``todo.*``) carries the todo's JSON as ``data``; a notice to a person carries
    its subject, text and links, and its data's keys."""
    event = str(notice.get("event", ""))
    data = notice.get("data") or {}
    if not event.startswith("todo."):
        data = {
            "subject": notice.get("subject", ""),
            "text": notice.get("text", ""),
            "links": notice.get("links") or {},
            **data,
        }
    return {"type": event, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "data": data}
