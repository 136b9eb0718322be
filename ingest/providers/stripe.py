"""Stripe: "Verify webhook signatures manually". ``Stripe-Signature: t=<ts>,v1=<hex>``, an HMAC-SHA256 of
``<t>.<body>`` keyed with the whole ``whsec_...`` string, within 300 s; the event id and type are in the
payload. Stripe makes the secret: it is pasted in, never generated here."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from ingest.errors import SignatureInvalid
from ingest.providers.base import (
    Provider,
    Verified,
    ascii_bytes,
    check_timestamp,
    checked_ids,
    hmac_sha256,
    kept,
    lower,
    parse_timestamp,
    text,
)

KEPT_HEADERS = ("User-Agent", "Content-Type")


def verify(raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None) -> Verified:
    h = lower(headers)
    timestamp: str | None = None
    candidates: list[bytes] = []
    for item in h.get("stripe-signature", "").split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and timestamp is None:
            timestamp = value
        elif key == "v1":  # v0 and any other scheme are ignored, as Stripe's own libraries do
            candidates.append(ascii_bytes(value))
    if timestamp is None or not candidates:
        raise SignatureInvalid("Missing or malformed Stripe-Signature header.")
    check_timestamp(parse_timestamp(timestamp, "Stripe-Signature"), now)
    signed = timestamp.encode() + b"." + raw_body
    for secret in secrets:
        # Stripe keys the HMAC with the whole "whsec_..." string, not a decoding of it.
        expected = hmac_sha256(secret.encode(), signed).hex().encode()
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return Verified("stripe", headers=kept(KEPT_HEADERS, h))
    raise SignatureInvalid("No Stripe-Signature v1 signature matches.")


def identify(verified: Verified, payload: dict[str, Any]) -> tuple[str, str]:
    body = payload if isinstance(payload, dict) else {}
    delivery_id, event_type = text(body.get("id")), text(body.get("type"))
    return checked_ids(delivery_id, event_type, "payload's id" if not delivery_id else "payload's type")


def new_secret() -> str:
    raise ValueError("Stripe makes the secret (whsec_...): pipe it in with --secret-stdin.")


PROVIDER = Provider(
    name="stripe",
    label="Stripe (Stripe-Signature)",
    verify=verify,
    identify=identify,
    kept_headers=KEPT_HEADERS,
    new_secret=new_secret,
)
