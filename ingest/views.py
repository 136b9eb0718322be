"""The webhook receiver: POST /ingest/<slug>/. No token: the provider's signature is the authentication.

Order (each step refuses before the next costs anything): body size (413), source and signature (401,
one answer for both: an unknown or inactive slug is "verified" against a decoy key, so neither the body
nor the timing of the refusal tells which slugs exist), JSON (400), then one transaction for the event
and its todos; 202 (or 200 for a redelivery) only after the commit. A database failure answers 503 so
the provider retries; nothing is half-stored.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.validators import slug_re
from django.db import DatabaseError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ingest import intake, providers
from ingest.errors import BodyTooLarge, IngestError, InvalidDelivery, SignatureInvalid, UnknownSource
from ingest.models import Source
from switchboard import dberrors
from switchboard.api import STATUS_BY_CODE, error_body
from switchboard.metrics import INGEST_DELIVERIES

logger = logging.getLogger("ingest")

# switchboard_ingest_deliveries_total{outcome}: why a delivery was refused. Anything else (our
# database, a misconfigured route) is "failed": the provider is told to retry.
_REFUSED = (
    (SignatureInvalid, "rejected_signature"),
    (UnknownSource, "rejected_unknown_source"),
    (BodyTooLarge, "rejected_too_large"),
    (InvalidDelivery, "rejected_invalid"),
)


def _count(source: Source | None, outcome: str) -> None:
    # Labelled by a configured source's slug only: a label per slug in the URL would let anyone mint series.
    INGEST_DELIVERIES.labels(source=source.slug if source is not None else "unknown", outcome=outcome).inc()


def _read_body(request: HttpRequest, limit: int) -> bytes:
    """The raw body, refused past ``limit`` bytes without buffering it: the declared Content-Length is
    checked first, and the read itself is bounded in case the declaration is absent or wrong."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise BodyTooLarge(f"The body is over {limit} bytes.")
    body = request.read(limit + 1)
    if len(body) > limit:
        raise BodyTooLarge(f"The body is over {limit} bytes.")
    return body


# The one refusal an unauthenticated sender sees, whatever the reason (no source, an inactive one, a
# missing, malformed, wrong or stale signature): the reason goes to the log, never to the sender.
NOT_AUTHENTIC = "The delivery is not signed by this source's secret, or the source does not exist."


def _error(exc: IngestError) -> JsonResponse:
    status = STATUS_BY_CODE[exc.code]
    if isinstance(exc, SignatureInvalid | UnknownSource):
        return JsonResponse(error_body(exc.code, NOT_AUTHENTIC), status=status)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JsonResponse(error_body(exc.code, exc.detail, **exc.extra), status=status, headers=headers)


@csrf_exempt
# Our own transaction is the outermost one even if ATOMIC_REQUESTS is turned on: its commit, not the
# request's, is what the 2xx promises.
@transaction.non_atomic_requests
def receive(request: HttpRequest, slug: str) -> JsonResponse:
    if request.method != "POST":
        return JsonResponse(
            error_body("method_not_allowed", "Webhooks are delivered with POST."), status=405, headers={"Allow": "POST"}
        )
    source = None
    try:
        raw_body = _read_body(request, settings.INGEST_MAX_BODY_BYTES)
        # A slug no source can have (a NUL byte, which PostgreSQL's text refuses) is unknown without a query.
        source = Source.objects.filter(slug=slug, is_active=True).first() if slug_re.fullmatch(slug) else None
        provider = providers.PROVIDERS.get(source.provider) if source is not None else None
        # A pull-only source (its provider verifies nothing) answers as if it did not exist.
        if source is None or provider is None or not provider.accepts_webhooks:
            providers.verify_nothing(raw_body)
            raise UnknownSource(f"No active source {slug!r}.")
        verified = provider.authenticate(raw_body, request.headers, source.secrets())
        payload = intake.parse_payload(provider.json_text(raw_body, request.content_type or ""))
        delivery_id, event_type = provider.identify(verified, payload)
        outcome = intake.store_and_route(
            source=source.slug,
            event_type=event_type,
            delivery_id=delivery_id,
            payload=payload,
            headers=verified.headers,
            routes=list(source.routes.filter(is_active=True).order_by("id")),
            traceparent=request.headers.get("traceparent"),
            body_sha256=hashlib.sha256(raw_body).hexdigest() if provider.dedupes_bodies else None,
        )
    except IngestError as exc:
        logger.warning("ingest rejected source=%r reason=%s: %s", slug, exc.code, exc.detail)
        _count(source, next((outcome for kind, outcome in _REFUSED if isinstance(exc, kind)), "failed"))
        return _error(exc)
    except DatabaseError as exc:
        # Whatever failed, the transaction rolled back: nothing is stored, and the provider must retry.
        # Even a failure that is not the database's fault (a value PostgreSQL refuses) stays a 503:
        # the delivery is kept by the provider until an operator fixes the cause.
        logger.warning("ingest rejected source=%r reason=database: %s", slug, dberrors.describe(exc))
        _count(source, "failed")
        code, detail = dberrors.error_answer(exc) or ("unavailable", "The database refused the delivery; retry later.")
        return JsonResponse(error_body(code, detail), status=503, headers={"Retry-After": "1"})
    body = {"event_id": outcome.event_id, "todo_ids": outcome.todo_ids, "duplicate": outcome.duplicate}
    _count(source, "duplicate" if outcome.duplicate else "accepted")
    if outcome.duplicate:
        logger.info(
            "ingest duplicate source=%r type=%r delivery=%r event=%s", slug, event_type, delivery_id, outcome.event_id
        )
        return JsonResponse(body, status=200)
    logger.info(
        "ingest accepted source=%r type=%r delivery=%r event=%s todos=%d",
        slug,
        event_type,
        delivery_id,
        outcome.event_id,
        len(outcome.todo_ids),
    )
    return JsonResponse(body, status=202)
