"""Pull-side ingestion: Redis Stream entries become events and todos, store-then-ack.

An entry is a flat map of fields: ``type`` (the event type), ``payload`` (a JSON object) and, optionally,
``delivery_id`` (the producer's own id, so that re-adding the same thing dedups; without one the id is
``<stream>:<entry id>``, so that re-reading the same entry dedups). Other fields are ignored.

One batch (up to --batch entries) is one transaction: each entry goes through intake.store_and_route,
the webhooks' own store-then-route step (an entry's savepoint: event plus todos, or a duplicate that makes
nothing), and XACK comes only after the commit. Whatever dies between read and ack leaves the entries
pending in the group; whoever takes them over (this consumer re-reading its own pending entries, or
another one by XAUTOCLAIM once they have been idle --claim-idle-ms) stores them, or finds them stored
(duplicates), and acks. Entries that can never be stored are recorded in the rejected stream and acked
in one MULTI, so a bad entry is either both recorded and acked or neither.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import DataError, IntegrityError, transaction

from ingest import intake
from ingest.errors import BodyTooLarge, DeliveryBusy, InvalidDelivery, RoutingFailed
from ingest.models import Route, Source
from ingest.providers import stream as stream_provider
from ingest.providers.base import MAX_ID_LENGTH
from ingest.routing import active_routes
from switchboard import dberrors, metrics
from todos.errors import QueueError

logger = logging.getLogger("ingest.streams")

# How often the consumer looks again at its source (active?) and routes (edited in the admin?).
ROUTES_REFRESH_SECONDS = 1.0
# A field kept in a rejected record is cut to this many bytes (the record is for a person to read).
REJECTED_FIELD_BYTES = 4096

Fields = Mapping[bytes, bytes]


@dataclass(frozen=True)
class StreamEvent:
    """What an entry says, once checked: enough for intake.store_and_route."""

    entry_id: str
    delivery_id: str
    event_type: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    entry_id: str
    fields: Fields
    reason: str  # the QueueError code: invalid | too_large
    detail: str


@dataclass
class BatchResult:
    """One pass's counts (river's runOnce result). ``acked`` are the entry ids safe to XACK: stored,
    duplicate or rejected; a ``failed`` entry (a route cannot make its todo) stays pending and is
    retried once it has been idle past --claim-idle-ms."""

    read: int = 0
    stored: int = 0
    duplicate: int = 0
    rejected: int = 0
    failed: int = 0
    acked: list[str] = field(default_factory=list)
    rejects: list[Rejected] = field(default_factory=list)


def _text(fields: Fields, name: bytes) -> str | None:
    raw = fields.get(name)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidDelivery(f"The {name.decode()} field is not UTF-8.") from exc


def entry_size(fields: Fields) -> int:
    return sum(len(k) + len(v) for k, v in fields.items())


def parse_entry(stream: str, entry_id: str, fields: Fields | None, *, max_bytes: int) -> StreamEvent:
    """Check an entry; raise InvalidDelivery or BodyTooLarge (the webhooks' own refusals) if it can never be stored."""
    if not fields:
        # XREADGROUP of pending history returns an entry trimmed from the stream with no fields.
        raise InvalidDelivery("The entry is gone from the stream (trimmed or deleted) or has no fields.")
    size = entry_size(fields)
    if size > max_bytes:
        raise BodyTooLarge(f"The entry is {size} bytes; the limit is {max_bytes}.")
    event_type = _text(fields, b"type")
    if not event_type:
        raise InvalidDelivery("The entry has no type field.")
    delivery_id = _text(fields, b"delivery_id") or f"{stream}:{entry_id}"
    if len(delivery_id) > MAX_ID_LENGTH or len(event_type) > MAX_ID_LENGTH:
        raise InvalidDelivery(f"The delivery id and type are at most {MAX_ID_LENGTH} characters.")
    if "\x00" in delivery_id or "\x00" in event_type:
        # PostgreSQL's text refuses it: left pending, the entry would be retried for ever.
        raise InvalidDelivery("The delivery id and type cannot contain a NUL byte.")
    raw_payload = fields.get(b"payload")
    if raw_payload is None:
        raise InvalidDelivery("The entry has no payload field (send {} for an event without data).")
    try:
        payload = intake.parse_payload(raw_payload)
    except InvalidDelivery as exc:
        # parse_payload speaks of a webhook's body; here it is the payload field.
        raise InvalidDelivery(str(exc.detail).replace("The body", "The payload field")) from exc
    return StreamEvent(entry_id=entry_id, delivery_id=delivery_id, event_type=event_type, payload=payload)


# What one entry can raise without the database being at fault: a route that cannot make its todo, a
# redelivery whose original keeps vanishing, a value PostgreSQL refuses. A DatabaseError beyond these
# (an outage) fails the whole batch.
_ENTRY_ERRORS = (RoutingFailed, DeliveryBusy, IntegrityError, DataError)


def store_batch(
    *, stream: str, source: str, routes: list[Route], entries: list[tuple[str, Fields | None]], max_bytes: int
) -> BatchResult:
    """Parse the entries and store the good ones in ONE transaction. A database outage raises
    (DatabaseError): the whole batch is then unstored, and the caller acks nothing."""
    result = BatchResult(read=len(entries))
    events: list[StreamEvent] = []
    for entry_id, fields in entries:
        try:
            events.append(parse_entry(stream, entry_id, fields, max_bytes=max_bytes))
        except (InvalidDelivery, BodyTooLarge) as exc:
            result.rejects.append(Rejected(entry_id, fields or {}, exc.code, str(exc.detail)))
            result.acked.append(entry_id)
    result.rejected = len(result.rejects)
    if not events:
        return result
    try:
        # The common case, every entry storable: no savepoints (two round trips fewer per entry).
        with transaction.atomic():
            _store(stream, source, routes, events, result, savepoints=False)
    except _ENTRY_ERRORS:
        # One entry cannot be stored and it aborted the batch: store it again, an entry per savepoint,
        # so that the others still go in and only that one stays pending.
        result.stored = result.duplicate = result.failed = 0
        del result.acked[result.rejected :]
        with transaction.atomic():
            _store(stream, source, routes, events, result, savepoints=True)
    return result


def _store(
    stream: str, source: str, routes: list[Route], events: list[StreamEvent], result: BatchResult, *, savepoints: bool
) -> None:
    for event in events:
        try:
            outcome = intake.store_and_route(
                source=source,
                event_type=event.event_type,
                delivery_id=event.delivery_id,
                payload=event.payload,
                headers={"stream": stream, "entry_id": event.entry_id},
                routes=routes,
                savepoint=savepoints,
            )
        except _ENTRY_ERRORS as exc:
            if not savepoints:
                raise
            # This entry's savepoint rolled back; the rest of the batch goes on. Left pending, it is
            # retried after --claim-idle-ms: the entry is fine, our configuration (or luck) is not.
            detail = exc.detail if isinstance(exc, QueueError) else dberrors.describe(exc)
            logger.warning("stream entry not stored stream=%r entry=%s: %s", stream, event.entry_id, detail)
            result.failed += 1
            continue
        result.acked.append(event.entry_id)
        if outcome.duplicate:
            result.duplicate += 1
        else:
            result.stored += 1


def rejected_record(rejected: Rejected, *, stream: str, group: str, consumer: str) -> dict[str, str | bytes]:
    """The rejected stream's entry: why, where from, and the entry's own fields (each cut short, and
    none of a too-large entry's: re-storing what the limit refused would defeat the limit)."""
    record: dict[str, str | bytes] = {
        "rejected_reason": rejected.reason,
        "rejected_detail": rejected.detail,
        "rejected_stream": stream,
        "rejected_entry_id": rejected.entry_id,
        "rejected_group": group,
        "rejected_consumer": consumer,
    }
    if rejected.reason == BodyTooLarge.code:
        record["rejected_size"] = str(entry_size(rejected.fields))
        return record
    for key, value in rejected.fields.items():
        name = key.decode("utf-8", errors="replace")
        if not name.startswith("rejected_"):
            record[name] = value[:REJECTED_FIELD_BYTES]
    return record


class StreamConsumer:
    """One consumer of a group: ``run_once`` reads a batch, stores it, then acks it; the command loops it.

    Where it reads from, in order: its own pending entries (at start and after any failure, since what it
    read but did not ack is still pending under its name), entries other consumers left idle past
    ``claim_idle_ms`` (XAUTOCLAIM, at most every half of that), then new entries (XREADGROUP >)."""

    def __init__(
        self,
        redis: Any,
        *,
        stream: str,
        group: str,
        consumer: str,
        source: str,
        batch: int,
        block_ms: int,
        claim_idle_ms: int,
        rejected_stream: str,
        rejected_maxlen: int,
        max_bytes: int,
    ) -> None:
        self.redis = redis
        self.stream, self.group, self.consumer, self.source = stream, group, consumer, source
        self.batch, self.block_ms, self.claim_idle_ms = batch, block_ms, claim_idle_ms
        self.rejected_stream, self.rejected_maxlen, self.max_bytes = rejected_stream, rejected_maxlen, max_bytes
        self.pending_from: str | None = "0"  # re-read own pending entries from this id; None: read new ones
        self.claim_cursor = "0-0"
        self.next_claim_at = 0.0
        self.routes: list[Route] | None = []  # None: the source is inactive or gone
        self.routes_at = -ROUTES_REFRESH_SECONDS

    def ensure_group(self) -> None:
        """Create the group (and the stream) if missing. From id 0: entries added before the first
        consumer ever started are work too, and re-reading one is harmless (it dedups)."""
        from redis.exceptions import ResponseError

        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            logger.info("stream group created stream=%r group=%r", self.stream, self.group)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def lost_track(self) -> None:
        """After a failure: what was read and not acked is pending under this consumer; read it again first."""
        self.pending_from = "0"

    def refresh_routes(self) -> list[Route] | None:
        now = time.monotonic()
        if now - self.routes_at >= ROUTES_REFRESH_SECONDS:
            active = Source.objects.filter(slug=self.source, is_active=True, provider=stream_provider.NAME).exists()
            if active != (self.routes is not None):
                logger.warning(
                    "stream source %r is %s", self.source, "active: reading" if active else "inactive: reading nothing"
                )
            self.routes = active_routes(self.source) if active else None
            self.routes_at = now
        return self.routes

    def read(self) -> tuple[str, list[tuple[str, Fields | None]]]:
        """(via, entries): one batch, from the first place that has any."""
        if self.pending_from is not None:
            entries = self._entries(
                self.redis.xreadgroup(self.group, self.consumer, {self.stream: self.pending_from}, count=self.batch)
            )
            if entries:
                self.pending_from = entries[-1][0]
                return "pending", entries
            self.pending_from = None
        if time.monotonic() >= self.next_claim_at:
            cursor, claimed, *deleted = self.redis.xautoclaim(
                self.stream, self.group, self.consumer, self.claim_idle_ms, self.claim_cursor, count=self.batch
            )
            self.claim_cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
            if self.claim_cursor == "0-0":  # a full scan of the pending list is done: rest until the next one
                self.next_claim_at = time.monotonic() + self.claim_idle_ms / 2000
            if deleted and deleted[0]:
                # Redis 7 drops entries trimmed from the stream from the pending list itself: nothing to store.
                logger.warning(
                    "stream entries gone before they were stored stream=%r count=%d", self.stream, len(deleted[0])
                )
            entries = [(_id(entry_id), fields) for entry_id, fields in claimed]
            if entries:
                return "claimed", entries
        response = self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=self.batch, block=self.block_ms
        )
        return "new", self._entries(response)

    @staticmethod
    def _entries(response: Any) -> list[tuple[str, Fields | None]]:
        if not response:
            return []
        [[_stream, entries]] = response
        return [(_id(entry_id), fields) for entry_id, fields in entries]

    def ack(self, result: BatchResult) -> None:
        """Record the rejected entries and ack everything handled, in one MULTI: all of it or none."""
        if not result.acked:
            return
        pipe = self.redis.pipeline(transaction=True)
        for rejected in result.rejects:
            record = rejected_record(rejected, stream=self.stream, group=self.group, consumer=self.consumer)
            pipe.xadd(self.rejected_stream, record, maxlen=self.rejected_maxlen, approximate=True)
        pipe.xack(self.stream, self.group, *result.acked)
        pipe.execute()

    def run_once(self) -> BatchResult | None:
        """One batch: read, store (one transaction), then ack. None when the source is inactive (nothing
        is read: the entries wait in Redis, as a webhook to an inactive source stores nothing)."""
        routes = self.refresh_routes()
        if routes is None:
            return None
        via, entries = self.read()
        if not entries:
            return BatchResult()
        metrics.STREAM_ENTRIES_READ.labels(stream=self.stream, via=via).inc(len(entries))
        result = store_batch(
            stream=self.stream, source=self.source, routes=routes, entries=entries, max_bytes=self.max_bytes
        )
        self.ack(result)  # only now: the batch is committed
        for outcome in ("stored", "duplicate", "rejected", "failed"):
            if count := getattr(result, outcome):
                metrics.STREAM_ENTRIES.labels(stream=self.stream, outcome=outcome).inc(count)
        for rejected in result.rejects:
            logger.warning(
                "stream entry rejected stream=%r entry=%s reason=%s: %s",
                self.stream,
                rejected.entry_id,
                rejected.reason,
                rejected.detail,
            )
        return result

    def group_info(self) -> dict[str, Any] | None:
        """The group's pending count and lag, for the metrics; None when Redis cannot be asked."""
        from redis.exceptions import RedisError

        try:
            groups = self.redis.xinfo_groups(self.stream)
        except RedisError:
            return None
        for info in groups:
            name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
            if name == self.group:
                return {"pending": int(info["pending"]), "lag": info.get("lag")}
        return None


def _id(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
