"""Reads that need one hand-written statement: the per-queue health counts of GET /api/v1/queues/ and
the moment a long-polling claim should wake up without a write. Both read only through the partial
indexes of todos/models.py, never through done history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from todos.models import Agent, glob_to_like

ALL = ["%"]

# One statement: the caller's queues from the small registry, then one grouped aggregate per live
# state, each read from its partial index (pending: todo_pending_claim_scan, an index-only scan that also
# yields the oldest run_at, when the longest-waiting todo became claimable; claimed:
# todo_claimed_lease_expiry; retry-waiting: todo_retry_due; dead-letters: todo_dead_letters; scheduled:
# todo_scheduled_due). Done todos are history and are not counted: that would scan it.
QUEUE_STATS = """
WITH q AS (SELECT name FROM todos_queue WHERE name LIKE ANY(%(visible)s::text[])),
pending AS (
    SELECT queue, count(*) AS n, min(run_at) AS oldest FROM todos_todo
    WHERE state = 'pending' AND queue IN (SELECT name FROM q) GROUP BY queue
),
claimed AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE state = 'claimed' AND queue IN (SELECT name FROM q) GROUP BY queue
),
retrying AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE state = 'failed' AND next_retry_at IS NOT NULL AND queue IN (SELECT name FROM q) GROUP BY queue
),
dead AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE state = 'failed' AND next_retry_at IS NULL AND queue IN (SELECT name FROM q) GROUP BY queue
),
scheduled AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE state = 'scheduled' AND queue IN (SELECT name FROM q) GROUP BY queue
)
SELECT q.name, COALESCE(pending.n, 0), COALESCE(claimed.n, 0), COALESCE(retrying.n, 0), COALESCE(dead.n, 0),
    EXTRACT(EPOCH FROM now() - pending.oldest)::double precision, COALESCE(scheduled.n, 0)
FROM q
LEFT JOIN pending ON pending.queue = q.name
LEFT JOIN claimed ON claimed.queue = q.name
LEFT JOIN retrying ON retrying.queue = q.name
LEFT JOIN dead ON dead.queue = q.name
LEFT JOIN scheduled ON scheduled.queue = q.name
ORDER BY q.name
"""

# Seconds (by the database's clock) until the earliest lease in the caller's queues lapses, the
# earliest scheduled retry comes due, or the earliest scheduled todo's run_at comes: work that becomes
# claimable with no write and so no NOTIFY. Negative when such work is claimable already; NULL when there
# is none. Same queue set and assignee rule as sql.CLAIM_NEXT. The scheduled branch is one descent of
# todo_scheduled_due per queue (its first entry is that queue's earliest run_at), so a million todos
# scheduled for later cost it nothing; an assignee filter may walk past the other agents' rows.
SECONDS_UNTIL_CLAIMABLE = """
WITH queues AS (
    SELECT name FROM todos_queue
    WHERE name LIKE ANY(%(scopes)s::text[]) AND name LIKE ANY(%(wanted)s::text[])
)
SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(t.lease_expires_at) FROM todos_todo t
     WHERE t.state = 'claimed' AND t.attempt < t.max_attempts AND t.queue IN (SELECT name FROM queues)
       AND (t.assignee IS NULL OR t.assignee = %(agent)s)),
    (SELECT min(t.next_retry_at) FROM todos_todo t
     WHERE t.state = 'failed' AND t.next_retry_at IS NOT NULL AND t.queue IN (SELECT name FROM queues)
       AND (t.assignee IS NULL OR t.assignee = %(agent)s)),
    (SELECT min(s.run_at) FROM queues CROSS JOIN LATERAL (
        SELECT t.run_at FROM todos_todo t
        WHERE t.state = 'scheduled' AND t.queue = queues.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.run_at LIMIT 1
    ) s)
) - now())::double precision
"""


@dataclass(frozen=True)
class QueueStats:
    queue: str
    pending: int
    claimed: int
    retry_waiting: int
    dead_letters: int
    oldest_pending_age_seconds: float | None
    scheduled: int = 0

    @property
    def failed(self) -> int:
        return self.retry_waiting + self.dead_letters


def queue_stats(agent: Agent) -> list[QueueStats]:
    """Counts for every queue the agent may see (its claim and create scopes), by name."""
    with connection.cursor() as cursor:
        cursor.execute(QUEUE_STATS, {"visible": agent.visible_like_patterns()})
        return [QueueStats(*row) for row in cursor.fetchall()]


def seconds_until_claimable(agent: Agent, queues: list[str] | None = None) -> float | None:
    params: dict[str, Any] = {
        "scopes": agent.claim_like_patterns(),
        "wanted": [glob_to_like(q) for q in queues] if queues else ALL,
        "agent": agent.name,
    }
    with connection.cursor() as cursor:
        cursor.execute(SECONDS_UNTIL_CLAIMABLE, params)
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])
