"""Store-then-ack: parse a verified delivery, then in ONE transaction insert its event (a redelivery
inserts nothing), create its todos and resolve the waits it matches (todos/queue/, resolve_events). The
receiver answers 2xx only after this returns, i.e. after the commit; any failure inside rolls back the
event, every todo and every resolution together."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from events.models import Event, new_event_id
from ingest.errors import DeliveryBusy, InvalidDelivery
from ingest.models import Route
from ingest.routing import route_event
from todos import limits, queue, tracing

logger = logging.getLogger("ingest")

# One statement decides "new or redelivery", race-free: of N concurrent identical deliveries exactly one
# INSERT wins; the others wait on the unique index event_unique_delivery until the winner commits (or
# aborts, and then one of them wins instead), insert nothing and return no row.
INSERT_EVENT = """
INSERT INTO events_event (id, source, type, delivery_id, payload, headers, received_at, body_sha256)
VALUES (%(id)s, %(source)s, %(type)s, %(delivery_id)s, %(payload)s, %(headers)s, now(), %(body_sha256)s)
ON CONFLICT (source, delivery_id) DO NOTHING
RETURNING received_at
"""

# A replayed body (security-review L2), for providers that sign only the body: the earliest event of
# this source with the same body within the window. Guard: source and body hash, received_at within the
# window. Lock: a transaction-scoped advisory lock on (source, body) taken first, so of two concurrent
# copies under different delivery ids the second waits for the first to commit and then finds it (each
# statement of READ COMMITTED sees what committed before it began). Index: event_body_sha256.
LOCK_BODY = "SELECT pg_advisory_xact_lock(hashtextextended(%(source)s || ':' || %(body_sha256)s, 0))"
FIND_SAME_BODY = """
SELECT id FROM events_event
WHERE source = %(source)s AND body_sha256 = %(body_sha256)s
  AND received_at > now() - make_interval(secs => %(window)s)
ORDER BY received_at, id
LIMIT 1
"""


@dataclass(frozen=True)
class Outcome:
    event_id: str
    todo_ids: list[str]
    duplicate: bool


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_storable(payload: Any) -> None:
    """PostgreSQL's jsonb refuses \\u0000 and unpaired surrogates, which Python's json accepts; refuse
    them here as bad input (400) rather than fail the insert. Iterative: nesting depth is the sender's."""
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            if "\x00" in value:
                raise InvalidDelivery("The payload contains a \\u0000 character, which cannot be stored.")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidDelivery("The payload contains an unpaired UTF-16 surrogate.") from exc


def parse_payload(text: bytes | str) -> dict[str, Any]:
    """The delivery's JSON object, from the JSON text its provider found in the body."""
    try:
        payload = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidDelivery("The body is not valid JSON.") from exc
    if not isinstance(payload, dict):
        raise InvalidDelivery("The body must be a JSON object.")
    _check_storable(payload)
    return payload


def _redelivery(first: Event) -> Outcome:
    todo_ids = list(first.todos.order_by("created_at", "id").values_list("id", flat=True))
    return Outcome(event_id=first.id, todo_ids=todo_ids, duplicate=True)


def store_and_route(
    *,
    source: str,
    event_type: str,
    delivery_id: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    routes: list[Route],
    savepoint: bool = True,
    traceparent: str | None = None,
    body_sha256: str | None = None,
) -> Outcome:
    """Insert the event and make its todos in one transaction, or recognise a redelivery and make nothing.
    Inside a caller's transaction this is a savepoint, unless ``savepoint=False``: then a failure here
    aborts the caller's whole transaction (a batch that saves two round trips per delivery for it).
    The todos keep the sender's ``traceparent``, or a trace this delivery starts (todos/tracing.py).
    ``body_sha256`` (providers that sign only the body): a delivery whose body this source delivered
    within the replay window, under whatever delivery id, is a redelivery of that first one."""
    event_id = new_event_id()
    params: dict[str, str | Jsonb | None] = {
        "id": event_id,
        "source": source,
        "type": event_type,
        "delivery_id": delivery_id,
        "payload": Jsonb(payload),
        "headers": Jsonb(headers),
        "body_sha256": body_sha256,
    }
    window = limits.ingest_replay_window_seconds()
    with tracing.delivery(source, event_type, traceparent) as trace, transaction.atomic(savepoint=savepoint):
        if body_sha256 is not None and window > 0:
            with connection.cursor() as cursor:
                cursor.execute(LOCK_BODY, {"source": source, "body_sha256": body_sha256})
                cursor.execute(FIND_SAME_BODY, {"source": source, "body_sha256": body_sha256, "window": window})
                same_body = cursor.fetchone()
            if same_body is not None:
                first = Event.objects.get(pk=same_body[0])
                if first.delivery_id != delivery_id:
                    logger.warning(
                        "ingest replayed body source=%r delivery=%r is the body of delivery=%r event=%s",
                        source,
                        delivery_id,
                        first.delivery_id,
                        first.id,
                    )
                return _redelivery(first)
        # A second pass only if the stored original vanished (purged) between our INSERT and the read.
        for _ in range(3):
            with connection.cursor() as cursor:
                # psycopg adapts its Jsonb wrapper; the stub lists only plain Python types as parameters.
                cursor.execute(INSERT_EVENT, params)  # type: ignore[arg-type]
                row = cursor.fetchone()
            if row is not None:
                break
            existing = Event.objects.filter(source=source, delivery_id=delivery_id).first()
            if existing is not None:
                return _redelivery(existing)
        else:
            raise DeliveryBusy("The delivery id is changing hands too fast; retry.")
        event = Event(
            id=event_id,
            source=source,
            type=event_type,
            delivery_id=delivery_id,
            payload=payload,
            headers=headers,
            received_at=row[0],
        )
        routed = route_event(event, routes, traceparent=trace)
        # The waits this event resolves, in the transaction that stores it: a redelivery (which stored
        # nothing above) resolves nothing, and a rollback undoes both.
        queue.resolve_events(
            event_id=event_id, source=source, event_type=event_type, payload=payload, received_at=row[0]
        )
    return Outcome(event_id=event_id, todo_ids=[r.todo.id for r in routed], duplicate=False)
