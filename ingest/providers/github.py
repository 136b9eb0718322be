"""GitHub: "Validating webhook deliveries". ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``;
the delivery id and event name are headers, and the payload's ``action`` (if any) is appended to the
type: ``pull_request`` + ``opened`` is ``pull_request.opened``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from ingest.errors import InvalidDelivery
from ingest.providers.base import Provider, Verified, checked_ids, kept, lower, sha256_hex_header, text

KEPT_HEADERS = (
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "X-GitHub-Hook-ID",
    "X-GitHub-Hook-Installation-Target-ID",
    "X-GitHub-Hook-Installation-Target-Type",
    "User-Agent",
    "Content-Type",
)


def verify(raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None) -> Verified:
    h = lower(headers)
    sha256_hex_header(raw_body, h.get("x-hub-signature-256"), secrets, "X-Hub-Signature-256")
    return Verified(
        "github",
        delivery_id=h.get("x-github-delivery") or None,
        event_type=h.get("x-github-event") or None,
        headers=kept(KEPT_HEADERS, h),
    )


def identify(verified: Verified, payload: dict[str, Any]) -> tuple[str, str]:
    delivery_id, event_type = verified.delivery_id, verified.event_type
    # ping and push have no action; a non-text action is not part of the type.
    action = text(payload.get("action")) if isinstance(payload, dict) else None
    if event_type and action:
        event_type = f"{event_type}.{action}"
    missing = "X-GitHub-Delivery header" if not delivery_id else "X-GitHub-Event header"
    return checked_ids(delivery_id, event_type, missing)


def json_text(raw_body: bytes, content_type: str) -> bytes | str:
    """GitHub may send ``application/x-www-form-urlencoded`` with the JSON in a ``payload`` field (its
    signature still covers the raw form body)."""
    if content_type.split(";")[0].strip().lower() != "application/x-www-form-urlencoded":
        return raw_body
    try:
        fields = parse_qs(raw_body.decode("utf-8"), strict_parsing=True)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidDelivery("The form body is malformed.") from exc
    if len(fields.get("payload", [])) != 1:
        raise InvalidDelivery("The form body has no payload field.")
    return fields["payload"][0]


PROVIDER = Provider(
    name="github",
    label="GitHub (X-Hub-Signature-256)",
    verify=verify,
    identify=identify,
    kept_headers=KEPT_HEADERS,
    json_text=json_text,
    dedupes_bodies=True,
)
