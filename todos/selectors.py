"""Reads that need one hand-written statement (todos/sql.py): the per-queue health counts that
GET /api/v1/queues/, the admin dashboard and /metrics all report, and the moment a long-polling claim
should wake up without a write. Both read only through the partial indexes of todos/models.py, never
through done history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from todos import sql
from todos.models import Agent, glob_to_like

ALL = ["%"]


@dataclass(frozen=True)
class QueueStats:
    queue: str
    pending: int
    claimed: int
    retry_waiting: int
    dead_letters: int
    oldest_pending: datetime | None
    # By the database's clock (SPEC decision 7); None when nothing is pending.
    oldest_pending_age_seconds: float | None
    scheduled: int = 0
    cancelled: int = 0
    # The queue's controls (todos/controls.py).
    paused: bool = False
    max_claimed: int | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None
    # Waiting for a dependency, an event, a token or a resolve (issue 20): still runnable, never claimed.
    waiting: int = 0

    @property
    def failed(self) -> int:
        return self.retry_waiting + self.dead_letters

    @property
    def unfinished(self) -> int:
        return self.pending + self.claimed + self.failed + self.scheduled + self.waiting


def queue_stats(agent: Agent | None = None) -> list[QueueStats]:
    """Counts for every queue the agent may see (its claim and create scopes), or every queue for
    ``None`` (the operator's views), by name. A registered queue with nothing in it reports zeros."""
    visible = agent.visible_like_patterns() if agent is not None else ALL
    with connection.cursor() as cursor:
        cursor.execute(sql.QUEUE_STATS, {"visible": visible})
        return [QueueStats(*row) for row in cursor.fetchall()]


def seconds_until_claimable(agent: Agent, queues: list[str] | None = None) -> float | None:
    params: dict[str, Any] = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [glob_to_like(q) for q in queues] if queues else ALL,
        "agent": agent.name,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql.SECONDS_UNTIL_CLAIMABLE, params)
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])
