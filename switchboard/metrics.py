"""The /metrics rendering and the project-wide metrics (HTTP requests, ingest deliveries).

Two kinds of numbers, two sources (docs/deploy.md, "Metrics", explains the choice):

* Events counted where they happen (HTTP requests here; transitions, lease lapses, reaper sweeps and
  purges in todos/metrics.py; ingest deliveries) are prometheus-client counters and histograms. Under
  gunicorn each worker is its own process, so gunicorn.conf.py turns on prometheus-client's
  multiprocess mode (PROMETHEUS_MULTIPROC_DIR): every worker writes its values to a memory-mapped file
  and /metrics, whichever worker answers, sums the files of all of them.
* State read at scrape time (the queue's, from PostgreSQL) comes from collectors that apps register
  with ``register_scrape_collector`` (todos does so in its AppConfig.ready()). The database is the truth
  that every web process and reaper shares; a per-process gauge could only ever see its own slice.

This module imports no app: the apps import it.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

# --- Counted where they happen ---------------------------------------------------------------------

# Counted by the ingest view (ingest/views.py): INGEST_DELIVERIES.labels(source=slug, outcome=...).inc().
# outcome is one of INGEST_OUTCOMES. ``source`` is a configured source's slug; a delivery refused before
# its source is known (an unknown slug, an oversized body) counts under source="unknown" (a label per
# URL an attacker invents would be unbounded).
INGEST_DELIVERIES = Counter(
    "switchboard_ingest_deliveries",
    "Webhook deliveries received, by source and outcome (accepted, duplicate, rejected_<reason>, failed).",
    ["source", "outcome"],
)
INGEST_OUTCOMES = (
    "accepted",
    "duplicate",
    "rejected_signature",  # missing, wrong or stale signature (401)
    "rejected_unknown_source",  # no active source with that slug (401, as a bad signature)
    "rejected_too_large",  # 413
    "rejected_invalid",  # authentic but unusable: not JSON, no delivery id or type (400)
    "failed",  # our side (database, a misconfigured route): 503, the provider retries
)

# Counted by manage.py consume_stream (ingest/streams.py), labelled by the stream's name (one series
# per stream a deployer configures). read: entries handed to this consumer, by how (new: XREADGROUP >;
# pending: its own unacked entries, re-read after a restart or an outage; claimed: XAUTOCLAIM from a
# consumer that went quiet). outcome: stored (a new event), duplicate (acked, nothing new), rejected
# (recorded in the rejected stream and acked), failed (a route could not make its todo: left pending).
STREAM_ENTRIES_READ = Counter(
    "switchboard_stream_entries_read", "Redis Stream entries read, by stream and how.", ["stream", "via"]
)
STREAM_ENTRIES = Counter(
    "switchboard_stream_entries", "Redis Stream entries handled, by stream and outcome.", ["stream", "outcome"]
)
STREAM_ERRORS = Counter(
    "switchboard_stream_errors",
    "Consumer passes that failed and were retried after a backoff, by what was unreachable (redis | database).",
    ["stream", "cause"],
)

# Labelled by the resolved URL pattern (e.g. "api/v1/todos/<str:todo_id>/complete/"), never the raw
# path, so the number of series is bounded by the number of routes.
HTTP_REQUESTS = Counter(
    "switchboard_http_requests",
    "HTTP requests answered, by method, route pattern and status.",
    ["method", "route", "status"],
)
HTTP_LATENCY = Histogram(
    "switchboard_http_request_duration_seconds",
    "HTTP request latency, by method and route pattern.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def record_ingest_delivery(source: str, outcome: str) -> None:
    """The counted form of INGEST_DELIVERIES that refuses an outcome outside the vocabulary."""
    if outcome not in INGEST_OUTCOMES:
        raise ValueError(f"unknown ingest outcome {outcome!r}; use one of {INGEST_OUTCOMES}")
    INGEST_DELIVERIES.labels(source=source, outcome=outcome).inc()


# --- Read at scrape time --------------------------------------------------------------------------


class ScrapeCollector(Protocol):
    """A collector that reads its numbers when scraped, caching them for a moment (``clear`` drops it)."""

    def collect(self) -> Iterator[Metric]: ...

    def describe(self) -> list[Metric]: ...

    def clear(self) -> None: ...


_scrape_collectors: list[ScrapeCollector] = []


def register_scrape_collector(collector: ScrapeCollector) -> None:
    """Add ``collector`` to every /metrics rendering (once, however often an app's ready() runs)."""
    if collector not in _scrape_collectors:
        _scrape_collectors.append(collector)


def clear_scrape_caches() -> None:
    """Forget every scrape collector's cached reading, so that the next scrape reads afresh (tests)."""
    for collector in _scrape_collectors:
        collector.clear()


class _DefaultRegistry:
    """This process's own metrics (single-process mode: development, tests, `manage.py` commands)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def render_latest() -> bytes:
    """The /metrics body: counters from every worker (multiprocess mode) or this process, plus the
    registered scrape collectors (the queue-state gauges read from the database)."""
    registry = CollectorRegistry(auto_describe=False)
    directory = multiprocess_dir()
    if directory:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    else:
        registry.register(_DefaultRegistry())
    for collector in _scrape_collectors:
        registry.register(collector)
    return generate_latest(registry)


def parse_networks(values: list[str]) -> list[Any]:
    """METRICS_ALLOWED_NETWORKS: CIDRs (or single addresses); a bad entry is a configuration error."""
    return [ipaddress.ip_network(v.strip(), strict=False) for v in values if v.strip()]


class StreamGroupCollector:
    """The consumer group's backlog, read from Redis at scrape time (XINFO GROUPS): ``pending``
    (delivered, not yet acked, across all its consumers) and ``lag`` (in the stream, not yet delivered).
    Like the queue gauges, the shared store is the truth: every consumer of the group reports the same."""

    def __init__(self, stream: str, group: str, read_group: Any) -> None:
        self.stream, self.group = stream, group
        self.read_group = read_group  # () -> {"pending": int, "lag": int | None} or None when Redis is down

    def describe(self) -> list[Metric]:
        return []  # nothing is read from Redis at registration time

    def collect(self) -> Iterator[Metric]:
        labels = [self.stream, self.group]
        up = GaugeMetricFamily(
            "switchboard_stream_redis_up",
            "1 if this scrape could read the group from Redis, else 0.",
            labels=["stream", "group"],
        )
        info = self.read_group()
        up.add_metric(labels, 0 if info is None else 1)
        yield up
        if info is None:
            return
        pending = GaugeMetricFamily(
            "switchboard_stream_pending",
            "Entries delivered to the group and not yet acked.",
            labels=["stream", "group"],
        )
        pending.add_metric(labels, info["pending"])
        yield pending
        if info.get("lag") is not None:  # Redis cannot tell after some deletions: no sample rather than a guess
            lag = GaugeMetricFamily(
                "switchboard_stream_lag",
                "Entries in the stream not yet delivered to the group.",
                labels=["stream", "group"],
            )
            lag.add_metric(labels, info["lag"])
            yield lag
