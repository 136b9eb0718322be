"""The queue's Prometheus metrics: the transitions, lapses, sweeps and purges counted where they happen,
and the queue-state gauges read from PostgreSQL at scrape time. Registered with switchboard/metrics.py
(the generic /metrics view and registry) by TodosConfig.ready(); docs/deploy.md, "Metrics", explains
the two sources.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from switchboard import dberrors
from todos.errors import QueueError

if TYPE_CHECKING:
    from todos.models import Todo

logger = logging.getLogger("switchboard.metrics")

# --- Counted where they happen ---------------------------------------------------------------------

# One increment per call of a todos/queue/ transition. outcome: "ok"; "duplicate" (create returned
# an existing runnable todo); "empty" (claim_next found nothing); or the QueueError code of a miss:
# "not_found", "conflict", "invalid". The batch doors (complete_many and the operator's *_many) count
# one per todo, as if each had been its own call; an operator batch counts the ids its guard passed
# over as "skipped". For the sweeps (lease_lapse, retry_due) one increment per row.
TRANSITIONS = Counter(
    "switchboard_todo_transitions",
    "Todo state-machine calls, by verb and outcome.",
    ["verb", "outcome"],
)
# Todos claimed from fair reservations (issue 31: CLAIM_FAIR_READY, without the queue's lock), per process: with
# switchboard_todo_transitions_total{verb="claim_next"} it tells how many claims a contended fair turn served.
FAIR_READY_CLAIMS = Counter(
    "switchboard_fair_ready_claims",
    "Todos claimed from fair reservations (reserved by a contended fair turn), without the queue's lock.",
)

# A lease that lapsed and was noticed: by the reaper (requeue_lapsed) or by a claim that took the
# lapsed todo before the reaper swept it (SPEC decision 1). outcome: requeued | dead_lettered | reclaimed.
LEASE_LAPSES = Counter(
    "switchboard_lease_lapses",
    "Leases that lapsed without heartbeat or completion, by who noticed and what became of the todo.",
    ["detected_by", "outcome"],
)

# A create with a parent refused by a spawn cap of its tree (issue 30), by the cap: max_depth | max_children |
# max_descendants. (Also counted in switchboard_todo_transitions{verb="create", outcome="spawn_limit"}.)
SPAWN_REFUSED = Counter(
    "switchboard_spawn_refused",
    "Creates of child todos refused by a spawn cap of their tree, by cap.",
    ["limit"],
)

# Usage reported by workers (issue 30: heartbeat and complete under the receipt), by queue and counter, and
# by agent and counter. Counter names come from workers, so the label set is bounded: the first
# USAGE_COUNTER_LABELS names this process sees are labels of their own, the rest count as "other".
USAGE_REPORTED = Counter(
    "switchboard_usage", "Usage reported on todos (tokens, cost, ...), by queue and counter.", ["queue", "counter"]
)
AGENT_USAGE_REPORTED = Counter(
    "switchboard_agent_usage", "Usage reported on todos, by the reporting agent and counter.", ["agent", "counter"]
)
USAGE_COUNTER_LABELS = 32
_usage_labels: set[str] = set()
_usage_lock = threading.Lock()


def count_usage(queue: str, agent: str, usage: dict[str, float]) -> None:
    """Add a report's usage to the usage counters (after its statement changed the todo)."""
    for name, value in usage.items():
        with _usage_lock:
            if name not in _usage_labels and len(_usage_labels) < USAGE_COUNTER_LABELS:
                _usage_labels.add(name)
            label = name if name in _usage_labels else "other"
        USAGE_REPORTED.labels(queue=queue, counter=label).inc(value)
        AGENT_USAGE_REPORTED.labels(agent=agent, counter=label).inc(value)


REAPER_SWEEPS = Counter("switchboard_reaper_sweeps", "Reaper sweeps, by outcome (ok | error).", ["outcome"])
REAPER_SWEEP_SECONDS = Histogram(
    "switchboard_reaper_sweep_duration_seconds",
    "Wall time of one reaper sweep (lapsed leases and due retries, all batches).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

PURGED = Counter(
    "switchboard_purged",
    "Rows deleted by retention (purge), by kind (done | dead | cancelled | event | queue).",
    ["kind"],
)

F = TypeVar("F", bound=Callable[..., Any])


def counted(verb: str, outcome: Callable[[Any], str] = lambda _result: "ok") -> Callable[[F], F]:
    """Count each call in switchboard_todo_transitions_total{verb, outcome}: the outcome of the result,
    or the code of the QueueError a miss raised. One counter increment: a few microseconds."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = function(*args, **kwargs)
            except QueueError as exc:
                TRANSITIONS.labels(verb=verb, outcome=exc.code).inc()
                raise
            TRANSITIONS.labels(verb=verb, outcome=outcome(result)).inc()
            return result

        return wrapper  # type: ignore[return-value]

    return decorate


def counted_batch(verb: str) -> Callable[[F], F]:
    """Count an operator batch door, ``(ids, ...) -> the todos it moved``: "ok" per todo moved,
    "skipped" per distinct id its guard passed over; a miss that fails the whole statement counts once
    by its code (the admin then retries the batch one door call at a time)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(ids: Sequence[str], *args: Any, **kwargs: Any) -> Any:
            try:
                moved = function(ids, *args, **kwargs)
            except QueueError as exc:
                TRANSITIONS.labels(verb=verb, outcome=exc.code).inc()
                raise
            if moved:
                TRANSITIONS.labels(verb=verb, outcome="ok").inc(len(moved))
            skipped = len(set(ids)) - len(moved)
            if skipped > 0:
                TRANSITIONS.labels(verb=verb, outcome="skipped").inc(skipped)
            return moved

        return wrapper  # type: ignore[return-value]

    return decorate


def _took_over_a_lapsed_lease(todo: Todo) -> bool:
    """True if the claim that returned ``todo`` took it over from a lapsed lease: that claim appended a
    "lease expired" entry stamped with its own claimed_at (todos/sql/claim.py, _CLAIM_SET)."""
    last = todo.errors[-1] if todo.errors else None
    if not isinstance(last, dict) or "reclaimed_at" not in last or todo.claimed_at is None:
        return False
    try:
        return datetime.fromisoformat(last["reclaimed_at"]) == todo.claimed_at
    except (TypeError, ValueError):
        return False


def count_lapsed_claims(todos: Iterable[Todo]) -> None:
    lapsed = sum(1 for todo in todos if _took_over_a_lapsed_lease(todo))
    if lapsed:
        LEASE_LAPSES.labels(detected_by="claim", outcome="reclaimed").inc(lapsed)


# --- Read from the database at scrape time ---------------------------------------------------------

LIVE_STATES = ("pending", "claimed", "failed", "scheduled", "waiting")


def gauge_values() -> dict[str, dict[str, float]]:
    """{queue: {"pending", "claimed", "failed", "dead", "retry_waiting", "scheduled", "waiting",
    "oldest_pending_age"}} for every queue, from todos/selectors.queue_stats (the statement the API and the
    dashboard read too). Done todos are history, not queue state, and are not counted; the completion rate is
    rate(switchboard_todo_transitions_total{verb="complete",outcome="ok"})."""
    from todos import selectors

    return {
        s.queue: {
            "pending": s.pending,
            "claimed": s.claimed,
            "retry_waiting": s.retry_waiting,
            "scheduled": s.scheduled,
            "waiting": s.waiting,
            "dead": s.dead_letters,
            "failed": s.failed,
            "oldest_pending_age": max(0.0, s.oldest_pending_age_seconds or 0.0),
            "cancelled": s.cancelled,
            "paused": 1.0 if s.paused else 0.0,
        }
        for s in selectors.queue_stats()
    }


class QueueStateCollector:
    """Gauges computed from gauge_values(), cached per process for ``ttl`` seconds so that several
    Prometheus servers (or an impatient operator) scraping at once cost one query per ttl."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, dict[str, float]]] | None = None

    def stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.ttl:
                self._cached = (now, gauge_values())
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
            logger.warning("metrics: queue state unavailable: %s", dberrors.describe(exc))
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
        cancelled = GaugeMetricFamily(
            "switchboard_cancelled",
            "Cancelled todos not yet removed by retention, by queue (the rate: "
            'switchboard_todo_transitions_total{verb="cancel"}).',
            labels=["queue"],
        )
        paused = GaugeMetricFamily("switchboard_queue_paused", "1 if the queue is paused, else 0.", labels=["queue"])
        for name in sorted(stats):
            entry = stats[name]
            for state in LIVE_STATES:
                todos.add_metric([name, state], entry[state])
            dead.add_metric([name], entry["dead"])
            waiting.add_metric([name], entry["retry_waiting"])
            oldest.add_metric([name], entry["oldest_pending_age"])
            cancelled.add_metric([name], entry["cancelled"])
            paused.add_metric([name], entry["paused"])
        yield from (todos, dead, waiting, oldest, cancelled, paused)


_queue_state: QueueStateCollector | None = None


def queue_state_collector() -> QueueStateCollector:
    global _queue_state
    if _queue_state is None:
        from django.conf import settings

        _queue_state = QueueStateCollector(ttl=float(settings.METRICS_CACHE_SECONDS))
    return _queue_state
