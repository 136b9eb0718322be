"""Why a delivery was refused. Like the queue's errors these know no HTTP: each carries a ``code`` that
switchboard/api.py's STATUS_BY_CODE turns into a status (SignatureInvalid and UnknownSource 401,
BodyTooLarge 413, InvalidDelivery 400, RoutingFailed and DeliveryBusy 503)."""

from __future__ import annotations

from switchboard.errors import ApplicationError


class IngestError(ApplicationError):
    """A delivery refused: the base the receiver catches (the queue's own errors are not these)."""


class SignatureInvalid(IngestError):
    """The signature is missing, malformed, made with another secret, or its timestamp is stale."""

    code = "unauthorized"


class UnknownSource(IngestError):
    """No active source that takes webhooks has this slug. It answers exactly as a bad signature does
    (ingest/views.py): a status per case would tell anyone which slugs exist."""

    code = "unauthorized"


class BodyTooLarge(IngestError):
    """The raw body is over INGEST_MAX_BODY_BYTES."""

    code = "too_large"


class InvalidDelivery(IngestError):
    """The delivery is authentic but unusable: not a JSON object, or no delivery id or event type."""

    code = "invalid"


class RoutingFailed(IngestError):
    """A route could not make its todo (e.g. a misconfigured queue). Nothing is stored and the provider
    is told to retry (503): the delivery is fine, our configuration is not."""

    code = "unavailable"


class DeliveryBusy(IngestError):
    """A redelivery's original was deleted (purged) while we looked at it, repeatedly: ask for a retry."""

    code = "unavailable"
