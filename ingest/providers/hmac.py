"""Plain HMAC, for senders of our own: ``X-Signature-256: sha256=<hex HMAC-SHA256>``, the delivery id in
``X-Delivery-Id``, the type in ``X-Event-Type`` or else the payload's ``type``.

Two ways to sign, the sender's choice per delivery:

- with ``X-Signature-Timestamp: <Unix seconds>``, the HMAC is of ``<delivery id>.<timestamp>.<body>``
  and the time must be within 300 s of ours: a captured delivery cannot be resent with a fresh id (the
  id is signed) nor after the tolerance, and resent as it was it is a redelivery (its id is stored);
- without it, the HMAC is of the body alone (GitHub's scheme under another name): kept for senders
  written before, it can be replayed under a fresh delivery id. docs/producers.md says so; new senders
  should sign with a timestamp, or use the ``standard`` provider (Standard Webhooks, the same idea with
  libraries in every language), which refuses unsigned ids outright.

A timestamped signature never verifies as a body-only one (the signed text differs), so a capture of
one cannot be downgraded by dropping the timestamp header."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ingest.providers.base import (
    Provider,
    Verified,
    check_timestamp,
    checked_ids,
    kept,
    lower,
    parse_timestamp,
    sha256_hex_header,
    text,
)

KEPT_HEADERS = ("X-Delivery-Id", "X-Event-Type", "User-Agent", "Content-Type")


def verify(raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None) -> Verified:
    h = lower(headers)
    timestamp = h.get("x-signature-timestamp")
    if timestamp is None:
        sha256_hex_header(raw_body, h.get("x-signature-256"), secrets, "X-Signature-256")
    else:
        check_timestamp(parse_timestamp(timestamp, "X-Signature-Timestamp"), now)
        signed = f"{h.get('x-delivery-id', '')}.{timestamp}.".encode() + raw_body
        sha256_hex_header(signed, h.get("x-signature-256"), secrets, "X-Signature-256")
    return Verified(
        "hmac",
        delivery_id=h.get("x-delivery-id") or None,
        event_type=h.get("x-event-type") or None,
        headers=kept(KEPT_HEADERS, h),
    )


def identify(verified: Verified, payload: dict[str, Any]) -> tuple[str, str]:
    body = payload if isinstance(payload, dict) else {}
    delivery_id = verified.delivery_id
    event_type = verified.event_type or text(body.get("type"))
    missing = "X-Delivery-Id header" if not delivery_id else "X-Event-Type header or payload type"
    return checked_ids(delivery_id, event_type, missing)


PROVIDER = Provider(
    name="hmac",
    label="Plain HMAC-SHA256 (X-Signature-256)",
    verify=verify,
    identify=identify,
    kept_headers=KEPT_HEADERS,
)
