"""The operator's dashboard: per queue, what is waiting, running, retrying and dead, and the last
hour's completions and failures per minute.

The counts are selectors.queue_stats (the statement the API and /metrics read too); the per-minute
series are sql.PER_MINUTE. Every number comes from an aggregate that one index serves (measured at 1M
rows, docs/benchmarks.md):
  pending count and oldest      todo_pending_claim_scan (queue, priority, run_at) WHERE pending
  claimed count                 todo_claimed_lease_expiry (few rows: one per working agent)
  retry-waiting count           todo_retry_queue_due (few rows: bounded by the retry window)
  dead-letter count             todo_dead_letters (queue, updated_at) WHERE dead
  scheduled count               todo_scheduled_due (queue, run_at) WHERE scheduled
  waiting count                 todo_waiting (queue) WHERE waiting
  completions per minute        todo_done_recent (completed_at) WHERE done, last hour only
  failures per minute           todo_failed_recent (updated_at) WHERE dead, last hour only, and
                                todo_retry_due (next_retry_at) WHERE retry-waiting, filtered (live work)

"Failures per minute" is a proxy: failed rows by the minute they last changed. A failure is an
entry in ``errors``, and counting those exactly means unpacking the JSON of every row touched in the
hour; the proxy misses a failure whose todo has since been retried and claimed again (it is counted
while the todo waits for its retry), which is the quiet case. Discards count as completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from todos import controls, selectors, sql, usage

MINUTES = 60


@dataclass
class QueueHealth:
    name: str
    pending: int = 0
    claimed: int = 0
    retry_waiting: int = 0
    dead: int = 0
    scheduled: int = 0
    waiting: int = 0
    cancelled: int = 0
    paused: bool = False
    limits: str = ""  # "max 3 · 20/s burst 5", or empty for an unlimited queue
    oldest_pending: datetime | None = None
    done_per_minute: list[int] = field(default_factory=lambda: [0] * MINUTES)
    failed_per_minute: list[int] = field(default_factory=lambda: [0] * MINUTES)

    @property
    def oldest_pending_seconds(self) -> float | None:
        if self.oldest_pending is None:
            return None
        return max((timezone.now() - self.oldest_pending).total_seconds(), 0.0)

    @property
    def done_last_hour(self) -> int:
        return sum(self.done_per_minute)

    @property
    def failed_last_hour(self) -> int:
        return sum(self.failed_per_minute)


def queue_health(minutes: int = MINUTES) -> tuple[list[QueueHealth], datetime]:
    """Every queue with anything unfinished or anything finished in the window, by name, and the
    database's now() (ages are measured against the database's clock, SPEC decision 7)."""
    queues: dict[str, QueueHealth] = {}

    def get(name: str) -> QueueHealth:
        if name not in queues:
            queues[name] = QueueHealth(name, done_per_minute=[0] * minutes, failed_per_minute=[0] * minutes)
        return queues[name]

    for stats in selectors.queue_stats():
        # A queue with nothing unfinished is listed only for its recent history, unless an operator has
        # paused or limited it (that must stay in view).
        if stats.unfinished or stats.paused or stats.max_claimed is not None or stats.rate_per_second is not None:
            health = get(stats.queue)
            health.pending, health.claimed = stats.pending, stats.claimed
            health.retry_waiting, health.dead = stats.retry_waiting, stats.dead_letters
            health.oldest_pending = stats.oldest_pending
            health.scheduled = stats.scheduled
            health.waiting = stats.waiting
        if stats.queue in queues:
            health = queues[stats.queue]
            health.cancelled, health.paused, health.limits = (
                stats.cancelled,
                stats.paused,
                controls.describe_limits(stats),
            )
    with connection.cursor() as cursor:
        cursor.execute("SELECT now(), date_trunc('minute', now())")
        now, this_minute = cursor.fetchone()
        cursor.execute(sql.PER_MINUTE, {"minutes": minutes})
        for name, what, minute, count in cursor.fetchall():
            slot = minutes - 1 - int((this_minute - minute) / timedelta(minutes=1))
            if 0 <= slot < minutes:
                series = get(name).done_per_minute if what == "done" else get(name).failed_per_minute
                series[slot] += count
    return sorted(queues.values(), key=lambda q: q.name), now


def chart_svg_bars(done: list[int], failed: list[int], *, width: int = 240, height: int = 40) -> dict[str, Any]:
    """Geometry for a small server-rendered bar chart (templates/admin/dashboard.html draws it)."""
    peak = max([*done, *failed, 1])
    n = len(done)
    step = width / n
    bars = []
    for i, (d, f) in enumerate(zip(done, failed, strict=True)):
        x = round(i * step, 2)
        dh = round(d / peak * (height - 2), 2)
        fh = round(f / peak * (height - 2), 2)
        bars.append(
            {
                "x": x,
                "w": round(max(step - 1, 1), 2),
                "done_h": dh,
                "failed_h": fh,
                "done_y": height - dh,
                "failed_y": height - dh - fh,
                "done": d,
                "failed": f,
                "ago": n - 1 - i,
            }
        )
    return {"width": width, "height": height, "peak": peak, "bars": bars}


def _totals(queues: list[QueueHealth]) -> QueueHealth:
    total = QueueHealth("all queues", done_per_minute=[0] * MINUTES, failed_per_minute=[0] * MINUTES)
    for q in queues:
        total.pending += q.pending
        total.claimed += q.claimed
        total.retry_waiting += q.retry_waiting
        total.dead += q.dead
        total.scheduled += q.scheduled
        total.waiting += q.waiting
        total.cancelled += q.cancelled
        if q.oldest_pending and (total.oldest_pending is None or q.oldest_pending < total.oldest_pending):
            total.oldest_pending = q.oldest_pending
        total.done_per_minute = [a + b for a, b in zip(total.done_per_minute, q.done_per_minute, strict=True)]
        total.failed_per_minute = [a + b for a, b in zip(total.failed_per_minute, q.failed_per_minute, strict=True)]
    return total


def dashboard_view(request: HttpRequest) -> HttpResponse:
    from django.contrib import admin

    queues, as_of = queue_health()
    total = _totals(queues)
    rows = [(q, chart_svg_bars(q.done_per_minute, q.failed_per_minute)) for q in queues]
    return TemplateResponse(
        request,
        "admin/dashboard.html",
        {
            **admin.site.each_context(request),
            "title": "Queue dashboard",
            "rows": rows,
            "total": total,
            "total_chart": chart_svg_bars(total.done_per_minute, total.failed_per_minute, width=600, height=90),
            "as_of": as_of,
            "refresh_seconds": 10,
            "orphans": usage.orphans(),
            "usage": usage.recent_usage(MINUTES),
        },
    )


def dashboard_json(request: HttpRequest) -> JsonResponse:
    queues, as_of = queue_health()
    return JsonResponse(
        {
            "as_of": as_of.isoformat(),
            # Issue 30: children whose parent was cancelled or dead-lettered while they are unfinished, and
            # the usage of the todos completed in the window, per queue and per agent.
            "orphans": usage.orphans(),
            "usage_last_hour": usage.recent_usage(MINUTES),
            "queues": [
                {
                    "name": q.name,
                    "pending": q.pending,
                    "claimed": q.claimed,
                    "retry_waiting": q.retry_waiting,
                    "dead_letters": q.dead,
                    "scheduled": q.scheduled,
                    "waiting": q.waiting,
                    "cancelled": q.cancelled,
                    "paused": q.paused,
                    "limits": q.limits,
                    "oldest_pending_seconds": q.oldest_pending_seconds,
                    "done_per_minute": q.done_per_minute,
                    "failed_per_minute": q.failed_per_minute,
                }
                for q in queues
            ],
        }
    )
