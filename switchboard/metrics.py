"""Every Prometheus metric Switchboard exports, by name, and the /metrics rendering.

Two kinds of numbers, two sources (docs/deploy.md, "Metrics", explains the choice):

* Events counted where they happen (transitions, lease lapses, reaper sweeps, ingest deliveries,
  HTTP requests) are prometheus-client counters and histograms. Under gunicorn each worker is its
  own process, so gunicorn.conf.py turns on prometheus-client's multiprocess mode
  (PROMETHEUS_MULTIPROC_DIR): every worker writes its values to a memory-mapped file and /metrics,
  whichever worker answers, sums the files of all of them.
* The state of the queue (todos by queue and state, dead-letters, oldest pending age) is read from
  PostgreSQL at scrape time by one grouped statement (QUEUE_STATS_SQL), cached for a few seconds.
  The database is the truth that every web process and reaper shares; a per-process gauge could
  only ever see its own slice.

This module defines metrics only; it imports no models, so todos/queue.py can import it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

# --- Counted where they happen ---------------------------------------------------------------------

# One increment per call of a todos/queue.py transition. outcome: "ok"; "duplicate" (create returned
# an existing runnable todo); "empty" (claim_next found nothing); or the QueueError code of a miss:
# "not_found", "conflict", "invalid". For the sweeps (lease_lapse, retry_due) one increment per row.
TRANSITIONS = Counter(
    "switchboard_todo_transitions",
    "Todo state-machine calls, by verb and outcome.",
    ["verb", "outcome"],
)

# A lease that lapsed and was noticed: by the reaper (requeue_lapsed) or by a claim that took the
# lapsed todo before the reaper swept it (SPEC decision 1). outcome: requeued | dead_lettered | reclaimed.
LEASE_LAPSES = Counter(
    "switchboard_lease_lapses",
    "Leases that lapsed without heartbeat or completion, by who noticed and what became of the todo.",
    ["detected_by", "outcome"],
)

REAPER_SWEEPS = Counter("switchboard_reaper_sweeps", "Reaper sweeps, by outcome (ok | error).", ["outcome"])
REAPER_SWEEP_SECONDS = Histogram(
    "switchboard_reaper_sweep_duration_seconds",
    "Wall time of one reaper sweep (lapsed leases and due retries, all batches).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

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
    "rejected_unknown_source",  # no active source with that slug (404)
    "rejected_too_large",  # 413
    "rejected_invalid",  # authentic but unusable: not JSON, no delivery id or type (400)
    "failed",  # our side (database, a misconfigured route): 503, the provider retries
)

PURGED = Counter("switchboard_purged", "Rows deleted by retention (purge), by kind (done | dead | event).", ["kind"])

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


# --- Read from the database at scrape time ---------------------------------------------------------

# One statement, one index per branch (measured on 1M rows: docs/benchmarks.md, "## operations"):
#   pending        index-only scan of todo_pending_claim_scan (queue, priority, run_at) WHERE pending:
#                  the count and the oldest run_at per queue (how long work has been claimable)
#   claimed        todo_claimed_lease_expiry (in-flight work: small)
#   retry_waiting  todo_retry_due (small)
#   dead           index-only scan of todo_dead_letters (queue, updated_at) WHERE dead
#   scheduled      index-only scan of todo_scheduled_due (queue, run_at) WHERE scheduled
#   known          the small todos_queue table, so an empty queue reports 0 instead of vanishing
# Done todos are history, not queue state: counting them costs a scan of everything retention has
# not yet purged, so they are left out; the completion rate is
# rate(switchboard_todo_transitions_total{verb="complete",outcome="ok"}).
QUEUE_STATS_SQL = """
SELECT name, 'known', 0, NULL::double precision FROM todos_queue
UNION ALL
SELECT queue, 'pending', count(*), extract(epoch FROM now() - min(run_at))::double precision
FROM todos_todo WHERE state = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'claimed', count(*), NULL FROM todos_todo WHERE state = 'claimed' GROUP BY queue
UNION ALL
SELECT queue, 'retry_waiting', count(*), NULL FROM todos_todo
WHERE state = 'failed' AND next_retry_at IS NOT NULL GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*), NULL FROM todos_todo
WHERE state = 'failed' AND next_retry_at IS NULL GROUP BY queue
UNION ALL
SELECT queue, 'scheduled', count(*), NULL FROM todos_todo WHERE state = 'scheduled' GROUP BY queue
"""

LIVE_STATES = ("pending", "claimed", "failed", "scheduled")


def queue_stats() -> dict[str, dict[str, float]]:
    """{queue: {"pending", "claimed", "failed", "dead", "retry_waiting", "scheduled", "oldest_pending_age"}}."""
    from django.db import connection

    stats: dict[str, dict[str, float]] = {}
    with connection.cursor() as cursor:
        cursor.execute(QUEUE_STATS_SQL)
        rows = cursor.fetchall()
    for name, bucket, count, oldest in rows:
        entry = stats.setdefault(
            name,
            {"pending": 0, "claimed": 0, "retry_waiting": 0, "dead": 0, "scheduled": 0, "oldest_pending_age": 0.0},
        )
        if bucket != "known":
            entry[bucket] = count
        if bucket == "pending":
            entry["oldest_pending_age"] = max(0.0, float(oldest))
    for entry in stats.values():
        entry["failed"] = entry["retry_waiting"] + entry["dead"]
    return stats


class QueueStateCollector:
    """Gauges computed from QUEUE_STATS_SQL, cached per process for ``ttl`` seconds so that several
    Prometheus servers (or an impatient operator) scraping at once cost one query per ttl."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, dict[str, float]]] | None = None

    def stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.ttl:
                self._cached = (now, queue_stats())
            return self._cached[1]

    def clear(self) -> None:
        with self._lock:
            self._cached = None

    def describe(self) -> list[Metric]:
        return []  # no query at registration time

    def collect(self) -> Iterator[Metric]:
        from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

        up = GaugeMetricFamily(
            "switchboard_database_up", "1 if this scrape could read the queue's state from PostgreSQL, else 0."
        )
        try:
            stats = self.stats()
        except DatabaseError as exc:
            # The counters are what an operator needs most during an outage (5xx, failed sweeps), so the
            # scrape still succeeds: without the queue gauges, and saying why.
            logger.warning("metrics: queue state unavailable: %s", exc.__class__.__name__)
            connections[DEFAULT_DB_ALIAS].close_if_unusable_or_obsolete()
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        todos = GaugeMetricFamily(
            "switchboard_todos",
            "Todos in each live state, by queue (failed = retry_waiting + dead; done is not counted).",
            labels=["queue", "state"],
        )
        dead = GaugeMetricFamily("switchboard_dead_letters", "Dead-lettered todos, by queue.", labels=["queue"])
        waiting = GaugeMetricFamily(
            "switchboard_retry_waiting", "Failed todos waiting for a scheduled retry, by queue.", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "switchboard_oldest_pending_age_seconds",
            "Age of the oldest pending todo, by queue (0 when none is pending).",
            labels=["queue"],
        )
        for name in sorted(stats):
            entry = stats[name]
            for state in LIVE_STATES:
                todos.add_metric([name, state], entry[state])
            dead.add_metric([name], entry["dead"])
            waiting.add_metric([name], entry["retry_waiting"])
            oldest.add_metric([name], entry["oldest_pending_age"])
        yield from (todos, dead, waiting, oldest)


_queue_state: QueueStateCollector | None = None


def queue_state_collector() -> QueueStateCollector:
    global _queue_state
    if _queue_state is None:
        from django.conf import settings

        _queue_state = QueueStateCollector(ttl=float(settings.METRICS_CACHE_SECONDS))
    return _queue_state


class _DefaultRegistry:
    """This process's own metrics (single-process mode: development, tests, `manage.py` commands)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def render_latest() -> bytes:
    """The /metrics body: counters from every worker (multiprocess mode) or this process, plus the
    queue-state gauges read from the database."""
    registry = CollectorRegistry(auto_describe=False)
    directory = multiprocess_dir()
    if directory:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_DefaultRegistry())  # type: ignore[arg-type]  # duck-typed collector
    registry.register(queue_state_collector())  # type: ignore[arg-type]
    return generate_latest(registry)


def parse_networks(values: list[str]) -> list[Any]:
    """METRICS_ALLOWED_NETWORKS: CIDRs (or single addresses); a bad entry is a configuration error."""
    return [ipaddress.ip_network(v.strip(), strict=False) for v in values if v.strip()]
