"""Signature verification, one function per provider, exactly as each provider specifies it.

Pure functions: ``(raw_body, headers, secrets) -> Verified`` or ``SignatureInvalid``. They work on the
raw bytes as received (never on re-serialised JSON), compare in constant time (``hmac.compare_digest``),
try every secret given (the current one and, during a rotation, the previous one), and never touch the
database. ``identify`` then takes the delivery id and event type from the headers and the parsed payload.

References:
- GitHub: "Validating webhook deliveries" (X-Hub-Signature-256, HMAC-SHA256 of the body, hex).
- Stripe: "Verify webhook signatures manually" (Stripe-Signature ``t=...,v1=...``, HMAC-SHA256 of
  ``<t>.<body>`` keyed with the whole ``whsec_...`` string, 300 s tolerance).
- Standard Webhooks spec (webhook-id/-timestamp/-signature, HMAC-SHA256 of ``<id>.<ts>.<body>`` keyed
  with the base64-decoded secret after ``whsec_``, base64 signatures, 5-minute tolerance).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.errors import InvalidDelivery, SignatureInvalid

# Stripe's and Standard Webhooks' replay window, both directions (a clock ahead is as suspect as behind).
TIMESTAMP_TOLERANCE_SECONDS = 300
MAX_ID_LENGTH = 200
MAX_KEPT_HEADER_LENGTH = 500

# Provider headers worth keeping on the event, in their canonical spelling. Never a signature.
KEPT_HEADERS: dict[str, tuple[str, ...]] = {
    "github": (
        "X-GitHub-Event",
        "X-GitHub-Delivery",
        "X-GitHub-Hook-ID",
        "X-GitHub-Hook-Installation-Target-ID",
        "X-GitHub-Hook-Installation-Target-Type",
        "User-Agent",
        "Content-Type",
    ),
    "stripe": ("User-Agent", "Content-Type"),
    "standard": ("webhook-id", "webhook-timestamp", "User-Agent", "Content-Type"),
    "hmac": ("X-Delivery-Id", "X-Event-Type", "User-Agent", "Content-Type"),
}


@dataclass(frozen=True)
class Verified:
    """An authentic delivery as far as its headers tell: ids the provider puts in headers (None when
    the provider puts them in the payload) and the headers worth keeping."""

    provider: str
    delivery_id: str | None = None
    event_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _kept(provider: str, lowered: dict[str, str]) -> dict[str, str]:
    return {
        name: lowered[name.lower()][:MAX_KEPT_HEADER_LENGTH]
        for name in KEPT_HEADERS[provider]
        if lowered.get(name.lower())
    }


def _hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _ascii(value: str) -> bytes:
    # Header values arrive as latin-1 decoded text; anything non-ASCII cannot match a hex or base64
    # signature, but it must still go through the constant-time compare rather than raise.
    return value.encode("utf-8", "replace")


def _sha256_hex_header(raw_body: bytes, given: str | None, secrets: list[str], header: str) -> None:
    """``<header>: sha256=<hex HMAC-SHA256(secret, body)>``: GitHub's scheme, and the plain hmac one."""
    if not given or not given.startswith("sha256="):
        raise SignatureInvalid(f"Missing or malformed {header} header.")
    given_bytes = _ascii(given)
    for secret in secrets:
        expected = b"sha256=" + _hmac_sha256(secret.encode(), raw_body).hex().encode()
        if hmac.compare_digest(expected, given_bytes):
            return
    raise SignatureInvalid(f"The {header} signature does not match.")


def _check_timestamp(timestamp: int, now: float | None) -> None:
    # The sender's clock against this server's wall clock, as the providers' own libraries compare it:
    # a replay window, not a queue guard (those use the database's now(), SPEC decision 7).
    current = time.time() if now is None else now
    if abs(current - timestamp) > TIMESTAMP_TOLERANCE_SECONDS:
        raise SignatureInvalid("The signature's timestamp is outside the 5-minute tolerance.")


def verify_github(
    raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
) -> Verified:
    h = _lower(headers)
    _sha256_hex_header(raw_body, h.get("x-hub-signature-256"), secrets, "X-Hub-Signature-256")
    return Verified(
        "github",
        delivery_id=h.get("x-github-delivery") or None,
        event_type=h.get("x-github-event") or None,
        headers=_kept("github", h),
    )


def verify_stripe(
    raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
) -> Verified:
    h = _lower(headers)
    timestamp: str | None = None
    candidates: list[bytes] = []
    for item in h.get("stripe-signature", "").split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and timestamp is None:
            timestamp = value
        elif key == "v1":  # v0 and any other scheme are ignored, as Stripe's own libraries do
            candidates.append(_ascii(value))
    if timestamp is None or not timestamp.isdigit() or not candidates:
        raise SignatureInvalid("Missing or malformed Stripe-Signature header.")
    _check_timestamp(int(timestamp), now)
    signed = timestamp.encode() + b"." + raw_body
    for secret in secrets:
        # Stripe keys the HMAC with the whole "whsec_..." string, not a decoding of it.
        expected = _hmac_sha256(secret.encode(), signed).hex().encode()
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return Verified("stripe", headers=_kept("stripe", h))
    raise SignatureInvalid("No Stripe-Signature v1 signature matches.")


def standard_key(secret: str) -> bytes:
    """A Standard Webhooks secret is ``whsec_`` + base64 of the key bytes."""
    encoded = secret.removeprefix("whsec_").rstrip("=")
    try:
        # Unpadded base64 is common: pad it back before the strict decode.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("A Standard Webhooks secret is 'whsec_' followed by base64.") from exc
    if not key:
        raise ValueError("The Standard Webhooks secret is empty.")
    return key


def verify_standard(
    raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
) -> Verified:
    h = _lower(headers)
    msg_id, timestamp, signatures = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not (msg_id and timestamp and signatures) or not timestamp.isdigit():
        raise SignatureInvalid("Missing or malformed webhook-id, webhook-timestamp or webhook-signature header.")
    _check_timestamp(int(timestamp), now)
    candidates: list[bytes] = []
    for versioned in signatures.split(" "):
        version, _, encoded = versioned.partition(",")
        if version != "v1":  # v1a (asymmetric) and future versions are not ours to check
            continue
        try:
            candidates.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    signed = f"{msg_id}.{timestamp}.".encode() + raw_body
    for secret in secrets:
        try:
            key = standard_key(secret)
        except ValueError:
            continue  # a malformed stored secret matches nothing; the admin form refuses to save one
        expected = _hmac_sha256(key, signed)
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return Verified("standard", delivery_id=msg_id, event_type=None, headers=_kept("standard", h))
    raise SignatureInvalid("No webhook-signature v1 signature matches.")


def verify_hmac(
    raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
) -> Verified:
    h = _lower(headers)
    _sha256_hex_header(raw_body, h.get("x-signature-256"), secrets, "X-Signature-256")
    return Verified(
        "hmac",
        delivery_id=h.get("x-delivery-id") or None,
        event_type=h.get("x-event-type") or None,
        headers=_kept("hmac", h),
    )


VERIFIERS: dict[str, Callable[..., Verified]] = {
    "github": verify_github,
    "stripe": verify_stripe,
    "standard": verify_standard,
    "hmac": verify_hmac,
}


def verify(
    provider: str, raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
) -> Verified:
    """Check the delivery's signature with any of ``secrets``; raise SignatureInvalid if none matches."""
    secrets = [s for s in secrets if s]
    if not secrets:
        raise SignatureInvalid("The source has no secret configured.")
    return VERIFIERS[provider](raw_body, headers, secrets, now=now)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def identify(verified: Verified, payload: Any) -> tuple[str, str]:
    """(delivery_id, event_type) of a verified delivery, from its headers or its payload as the provider
    puts them. Raises InvalidDelivery when either is missing."""
    body = payload if isinstance(payload, dict) else {}
    provider = verified.provider
    if provider == "github":
        delivery_id, event_type = verified.delivery_id, verified.event_type
        # "pull_request" + "opened" -> "pull_request.opened"; ping and push have no action.
        action = _text(body.get("action"))
        if event_type and action:
            event_type = f"{event_type}.{action}"
        missing = "X-GitHub-Delivery header" if not delivery_id else "X-GitHub-Event header"
    elif provider == "stripe":
        delivery_id, event_type = _text(body.get("id")), _text(body.get("type"))
        missing = "payload's id" if not delivery_id else "payload's type"
    elif provider == "standard":
        delivery_id, event_type = verified.delivery_id, _text(body.get("type"))
        missing = "payload's type"
    else:
        delivery_id = verified.delivery_id
        event_type = verified.event_type or _text(body.get("type"))
        missing = "X-Delivery-Id header" if not delivery_id else "X-Event-Type header or payload type"
    if not delivery_id or not event_type:
        raise InvalidDelivery(f"The delivery has no {missing}.")
    if len(delivery_id) > MAX_ID_LENGTH or len(event_type) > MAX_ID_LENGTH:
        raise InvalidDelivery(f"The delivery id and event type are at most {MAX_ID_LENGTH} characters.")
    return delivery_id, event_type
