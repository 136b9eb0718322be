"""The Redis Streams sidecar: entries of one stream, read through a consumer group, become events and
todos of a ``stream`` source (ingest/streams.py); each batch is acked only after it is committed.

Run any number per group (each with its own --consumer name): Redis hands each entry to one of them, and
XAUTOCLAIM hands a dead one's entries to another. Redis or PostgreSQL down: it logs, backs off, retries,
and acks nothing it has not stored. SIGTERM/SIGINT: the batch in hand is stored and acked, then it exits.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections

from ingest.models import Source
from ingest.providers import stream as stream_provider
from ingest.streams import StreamConsumer
from switchboard import dberrors, metrics

logger = logging.getLogger("ingest.streams")

# Backoff after a failed pass (Redis or the database unreachable): full jitter over a doubling step.
BACKOFF_BASE_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 10.0
# How often the loop lets Django retire its connection (CONN_MAX_AGE) and health-check it again: not
# every pass, since the check is a round trip, and at batch 1 a pass is a single entry.
CONNECTION_CHECK_SECONDS = 1.0


def _redis_client(url: str, block_ms: int) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No silent retries inside redis-py: a retried XREADGROUP may deliver a batch twice over a broken
    # connection; the loop's own backoff re-reads this consumer's pending entries instead. The socket
    # timeout outlasts a blocking read (else every idle --block-ms would look like an outage).
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=5,
        socket_timeout=block_ms / 1000 + 10,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
    )


def _backoff(failures: int) -> float:
    return random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**failures))  # noqa: S311 (jitter, not a secret)


def _where(client: Any) -> str:
    """host:port/db of the client, never its password."""
    kw = client.connection_pool.connection_kwargs
    return f"{kw.get('host', kw.get('path', '?'))}:{kw.get('port', '')}/{kw.get('db', 0)}"


class Command(BaseCommand):
    help = "Consume a Redis Stream through a consumer group into events and todos (store, then XACK)."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--redis-url", default=None, help="Default: the STREAM_REDIS_URL setting.")
        parser.add_argument("--stream", required=True, help="The stream's key.")
        parser.add_argument("--group", required=True, help="The consumer group (created with MKSTREAM if missing).")
        parser.add_argument("--source", required=True, help="The slug of an active source of provider 'stream'.")
        parser.add_argument("--consumer", default=None, help="This consumer's name in the group (default host-pid).")
        parser.add_argument("--batch", type=int, default=100, help="Entries per read, stored in one transaction.")
        parser.add_argument("--block-ms", type=int, default=1000, help="How long one read waits for new entries.")
        parser.add_argument(
            "--claim-idle-ms",
            type=int,
            default=30000,
            help="Take over entries another consumer left unacked this long (XAUTOCLAIM).",
        )
        parser.add_argument("--metrics-port", type=int, default=None, help="Default: STREAM_METRICS_PORT (0 = off).")
        parser.add_argument("--drain", action="store_true", help="Exit once a read finds nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("batch", "block_ms", "claim_idle_ms"):
            if options[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1.")
        source = self.find_source(options["source"])
        if source is None:
            return  # stopped while waiting for the database
        if source.provider != stream_provider.NAME:
            raise CommandError(f"The source {source.slug!r} is of provider {source.provider!r}, not 'stream'.")
        client = _redis_client(options["redis_url"] or settings.STREAM_REDIS_URL, options["block_ms"])
        consumer = StreamConsumer(
            client,
            stream=options["stream"],
            group=options["group"],
            consumer=options["consumer"] or f"{socket.gethostname()}-{os.getpid()}",
            source=source.slug,
            batch=options["batch"],
            block_ms=options["block_ms"],
            claim_idle_ms=options["claim_idle_ms"],
            rejected_stream=settings.STREAM_REJECTED_STREAM.format(stream=options["stream"]),
            rejected_maxlen=settings.STREAM_REJECTED_MAXLEN,
            max_bytes=settings.INGEST_MAX_BODY_BYTES,
        )
        port = options["metrics_port"] if options["metrics_port"] is not None else settings.STREAM_METRICS_PORT
        if port:
            from prometheus_client import REGISTRY, start_http_server

            REGISTRY.register(metrics.StreamGroupCollector(consumer.stream, consumer.group, consumer.group_info))
            start_http_server(port)
        logger.info(
            "stream consumer started redis=%s stream=%r group=%r consumer=%r source=%r batch=%d",
            _where(client),
            consumer.stream,
            consumer.group,
            consumer.consumer,
            consumer.source,
            consumer.batch,
        )
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.loop(consumer, drain=options["drain"])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        logger.info("stream consumer stopped consumer=%r", consumer.consumer)

    def find_source(self, slug: str) -> Source | None:
        """The configured source; while PostgreSQL is unreachable, wait for it (a sidecar started
        before its database should not crash-loop). Raises CommandError if there is no such source."""
        failures = 0
        while True:
            try:
                source = Source.objects.filter(slug=slug).first()
            except DatabaseError as exc:
                failures += 1
                logger.warning("stream consumer cannot read its source yet: %s", dberrors.describe(exc))
                close_old_connections()
                if self.stopping.wait(_backoff(failures)):
                    return None
                continue
            if source is None:
                raise CommandError(f"No source {slug!r}; create it with add_source --provider stream.")
            return source

    def _stop(self, signum: int, frame: Any) -> None:
        # Checked between batches: the one in hand is stored and acked first.
        self.stopping.set()

    def loop(self, consumer: StreamConsumer, *, drain: bool = False) -> None:
        from redis.exceptions import RedisError, ResponseError

        failures = 0
        group_ready = False
        next_connection_check = 0.0
        while not self.stopping.is_set():
            if time.monotonic() >= next_connection_check:
                close_old_connections()
                next_connection_check = time.monotonic() + CONNECTION_CHECK_SECONDS
            try:
                if not group_ready:
                    consumer.ensure_group()
                    group_ready = True
                result = consumer.run_once()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise  # a command Redis refuses is a bug or a misconfiguration (wrong key type): stop
                # The stream or its group vanished (deleted, or a Redis restarted without its data).
                logger.warning("stream group missing stream=%r group=%r: creating it", consumer.stream, consumer.group)
                group_ready = False
                consumer.lost_track()
                continue
            except (RedisError, DatabaseError) as exc:
                cause = "redis" if isinstance(exc, RedisError) else "database"
                failures += 1
                delay = _backoff(failures)
                logger.warning(
                    "stream consumer pass failed stream=%r cause=%s error=%s; retrying in %.1fs",
                    consumer.stream,
                    cause,
                    f"{exc.__class__.__name__}: {exc}" if isinstance(exc, RedisError) else dberrors.describe(exc),
                    delay,
                )
                metrics.STREAM_ERRORS.labels(stream=consumer.stream, cause=cause).inc()
                consumer.lost_track()
                close_old_connections()
                next_connection_check = 0.0
                self.stopping.wait(delay)
                continue
            if failures:
                logger.info("stream consumer recovered stream=%r after %d failed passes", consumer.stream, failures)
                failures = 0
            if result is None:  # the source is inactive: nothing is read until it is switched back on
                self.stopping.wait(consumer.block_ms / 1000)
                continue
            if result.read:
                logger.info(
                    "stream batch stream=%r read=%d stored=%d duplicate=%d rejected=%d failed=%d",
                    consumer.stream,
                    result.read,
                    result.stored,
                    result.duplicate,
                    result.rejected,
                    result.failed,
                )
            elif drain and consumer.pending_from is None:
                return
