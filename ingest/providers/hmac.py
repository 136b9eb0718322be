"""Plain HMAC, for senders of our own: ``X-Signature-256: sha256=<hex HMAC-SHA256 of the body>`` (GitHub's
scheme under another name), the delivery id in ``X-Delivery-Id``, the type in ``X-Event-Type`` or else
the payload's ``type``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ingest.providers.base import Provider, Verified, checked_ids, kept, lower, sha256_hex_header, text

KEPT_HEADERS = ("X-Delivery-Id", "X-Event-Type", "User-Agent", "Content-Type")


def verify(raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None) -> Verified:
    h = lower(headers)
    sha256_hex_header(raw_body, h.get("x-signature-256"), secrets, "X-Signature-256")
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
