"""Standard Webhooks (the spec at standardwebhooks.com): ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature`` headers, an HMAC-SHA256 of ``<id>.<ts>.<body>`` keyed with the base64-decoded
secret after ``whsec_``, base64 signatures, a 5-minute tolerance; the type is in the payload."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets as secrets_module
from collections.abc import Mapping
from typing import Any

from ingest.errors import SignatureInvalid
from ingest.providers.base import (
    Provider,
    Verified,
    check_timestamp,
    checked_ids,
    hmac_sha256,
    kept,
    lower,
    parse_timestamp,
    text,
)

KEPT_HEADERS = ("webhook-id", "webhook-timestamp", "User-Agent", "Content-Type")


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


def verify(raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None) -> Verified:
    h = lower(headers)
    msg_id, timestamp, signatures = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise SignatureInvalid("Missing or malformed webhook-id, webhook-timestamp or webhook-signature header.")
    check_timestamp(parse_timestamp(timestamp, "webhook-timestamp"), now)
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
        expected = hmac_sha256(key, signed)
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return Verified("standard", delivery_id=msg_id, event_type=None, headers=kept(KEPT_HEADERS, h))
    raise SignatureInvalid("No webhook-signature v1 signature matches.")


def identify(verified: Verified, payload: dict[str, Any]) -> tuple[str, str]:
    body = payload if isinstance(payload, dict) else {}
    return checked_ids(verified.delivery_id, text(body.get("type")), "payload's type")


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets_module.token_bytes(32)).decode()


def check_secret(secret: str) -> None:
    standard_key(secret)


PROVIDER = Provider(
    name="standard",
    label="Standard Webhooks (webhook-signature)",
    verify=verify,
    identify=identify,
    kept_headers=KEPT_HEADERS,
    new_secret=new_secret,
    check_secret=check_secret,
)
