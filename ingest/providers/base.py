"""What a webhook provider is, and the pieces the providers share.

A provider's verifier is a pure function, ``(raw_body, headers, secrets, *, now) -> Verified`` or
``SignatureInvalid``: it works on the raw bytes as received (never on re-serialised JSON), compares in
constant time (``hmac.compare_digest``), tries every secret given (the current one and, during a
rotation, the previous one), and never touches the database. Its ``identify`` then takes the delivery
id and event type from the headers and the parsed payload.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as secrets_module
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingest.errors import InvalidDelivery, SignatureInvalid
from todos.limits import MAX_TIMESTAMP_DIGITS

# The replay window of Stripe, Standard Webhooks and timestamped plain HMAC, both directions (a clock
# ahead is as suspect as behind).
TIMESTAMP_TOLERANCE_SECONDS = 300
MAX_ID_LENGTH = 200
MAX_KEPT_HEADER_LENGTH = 500
# What a slug without a source is "verified" with: a refusal then costs what a wrong signature costs.
_DECOY_KEY = secrets_module.token_bytes(32)


@dataclass(frozen=True)
class Verified:
    """An authentic delivery as far as its headers tell: ids the provider puts in headers (None when
    the provider puts them in the payload) and the headers worth keeping."""

    provider: str
    delivery_id: str | None = None
    event_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Verifier(Protocol):
    def __call__(
        self, raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
    ) -> Verified: ...


Identifier = Callable[[Verified, dict[str, Any]], tuple[str, str]]


def raw_json(raw_body: bytes, content_type: str) -> bytes | str:
    """The JSON text of a delivery: the body itself, for every provider that posts application/json."""
    return raw_body


def token_secret() -> str:
    return secrets_module.token_urlsafe(32)


def any_secret(secret: str) -> None:
    """Any non-empty string can key an HMAC."""


@dataclass(frozen=True)
class Provider:
    """One provider: how its deliveries are verified and identified, the headers kept on its events, and
    how its secrets are made and checked. ``verify`` None is a pull-only provider (its entries are read,
    not POSTed): the webhook receiver refuses deliveries to its sources."""

    name: str  # Source.provider's value
    label: str  # the admin's and add_source's description
    verify: Verifier | None
    identify: Identifier
    # Provider headers worth keeping on the event, in their canonical spelling. Never a signature.
    kept_headers: tuple[str, ...] = ()
    # Where the JSON is in a delivery (GitHub may post it form-encoded).
    json_text: Callable[[bytes, str], bytes | str] = raw_json
    # A strong new secret for add_source; raises ValueError when the provider makes its own.
    new_secret: Callable[[], str] = token_secret
    # Raises ValueError for a secret this provider cannot use (the admin form and add_source refuse it).
    check_secret: Callable[[str], None] = any_secret
    # The signature covers the body alone (no id, no time): a captured delivery resent with a fresh
    # delivery id would verify, so a body seen within the replay window is a duplicate (ingest/intake.py).
    # Only for senders whose distinct events never share a body (GitHub's carry ids and times).
    dedupes_bodies: bool = False

    @property
    def accepts_webhooks(self) -> bool:
        return self.verify is not None

    def authenticate(
        self, raw_body: bytes, headers: Mapping[str, str], secrets: list[str], *, now: float | None = None
    ) -> Verified:
        """Check the delivery's signature with any of ``secrets``; raise SignatureInvalid if none matches."""
        if self.verify is None:
            raise SignatureInvalid(f"{self.label} sources take no webhook deliveries.")
        secrets = [s for s in secrets if s]
        if not secrets:
            raise SignatureInvalid("The source has no secret configured.")
        return self.verify(raw_body, headers, secrets, now=now)


def lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def kept(names: tuple[str, ...], lowered: dict[str, str]) -> dict[str, str]:
    # Without NUL bytes: jsonb refuses \u0000, and a header not worth refusing a delivery for.
    return {
        name: lowered[name.lower()][:MAX_KEPT_HEADER_LENGTH].replace("\x00", "")
        for name in names
        if lowered.get(name.lower())
    }


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def ascii_bytes(value: str) -> bytes:
    # Header values arrive as latin-1 decoded text; anything non-ASCII cannot match a hex or base64
    # signature, but it must still go through the constant-time compare rather than raise.
    return value.encode("utf-8", "replace")


def sha256_hex_header(raw_body: bytes, given: str | None, secrets: list[str], header: str) -> None:
    """``<header>: sha256=<hex HMAC-SHA256(secret, body)>``: GitHub's scheme, and the plain hmac one."""
    if not given or not given.startswith("sha256="):
        raise SignatureInvalid(f"Missing or malformed {header} header.")
    given_bytes = ascii_bytes(given)
    for secret in secrets:
        expected = b"sha256=" + hmac_sha256(secret.encode(), raw_body).hex().encode()
        if hmac.compare_digest(expected, given_bytes):
            return
    raise SignatureInvalid(f"The {header} signature does not match.")


def verify_nothing(raw_body: bytes) -> None:
    """The work of a signature that fails, for a slug with no source that takes webhooks: one
    HMAC-SHA256 of the body and a constant-time compare, so neither the answer nor its timing tells an
    unknown slug from a known one with a wrong signature."""
    hmac.compare_digest(hmac_sha256(_DECOY_KEY, raw_body), _DECOY_KEY)


def parse_timestamp(value: str | None, header: str) -> int:
    """A signature header's Unix time. ``str.isdigit`` alone would pass "²" and 5,000-digit strings,
    which ``int()`` then refuses with a ValueError (a 500): only short ASCII digit strings are times."""
    if not value or not (value.isascii() and value.isdigit() and len(value) <= MAX_TIMESTAMP_DIGITS):
        raise SignatureInvalid(f"Missing or malformed {header} timestamp.")
    return int(value)


def check_timestamp(timestamp: int, now: float | None) -> None:
    # The sender's clock against this server's wall clock, as the providers' own libraries compare it:
    # a replay window, not a queue guard (those use the database's now(), SPEC decision 7).
    current = time.time() if now is None else now
    if abs(current - timestamp) > TIMESTAMP_TOLERANCE_SECONDS:
        raise SignatureInvalid("The signature's timestamp is outside the 5-minute tolerance.")


def text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def checked_ids(delivery_id: str | None, event_type: str | None, missing: str) -> tuple[str, str]:
    """The pair ``identify`` returns, or InvalidDelivery naming what the delivery lacks."""
    if not delivery_id or not event_type:
        raise InvalidDelivery(f"The delivery has no {missing}.")
    if len(delivery_id) > MAX_ID_LENGTH or len(event_type) > MAX_ID_LENGTH:
        raise InvalidDelivery(f"The delivery id and event type are at most {MAX_ID_LENGTH} characters.")
    if "\x00" in delivery_id or "\x00" in event_type:
        # PostgreSQL's text refuses it: a 503 would have the sender retry a delivery that can never be stored.
        raise InvalidDelivery("The delivery id and event type cannot contain a NUL byte.")
    return delivery_id, event_type
