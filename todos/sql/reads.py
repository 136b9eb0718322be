"""Reads that need one hand-written statement: each queue's counts and controls (todos/selectors.py),
when a long-poll's next claimable todo comes (todos/longpoll.py), the dashboard's per-minute figures.
"""

from todos import states as S
from todos.sql import flow

# queue_stats (todos/selectors.py; feeds GET /api/v1/queues/, the admin dashboard and /metrics): per
# queue the caller may see, from the small registry (so an empty queue reports zeros), one grouped
# aggregate per live state, each read from its partial index: pending from todo_pending_claim_scan (an
# index-only scan that also yields the oldest run_at, when the longest-waiting todo became claimable),
# claimed from todo_claimed_lease_expiry, retry-waiting from todo_retry_queue_due (per queue: the
# global todo_retry_due would walk every queue's retries), dead-letters from
# todo_dead_letters, scheduled from todo_scheduled_due, cancelled from todo_cancelled_recent (index-only;
# retention keeps it short), waiting from todo_waiting (index-only). Done todos are history and are not
# counted: that would scan it. Also each queue's controls. Measured at 1M rows in docs/benchmarks.md ("Operations").
QUEUE_STATS = f"""
WITH q AS (SELECT name FROM todos_queue WHERE name LIKE ANY(%(visible)s::text[])),
pending AS (
    SELECT queue, count(*) AS n, min(run_at) AS oldest FROM todos_todo
    WHERE {S.PENDING.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
claimed AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.CLAIMED.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
retrying AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.RETRY_WAITING.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
dead AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.DEAD_LETTER.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
scheduled AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.SCHEDULED.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
cancelled AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.CANCELLED.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
),
waiting AS (
    SELECT queue, count(*) AS n FROM todos_todo
    WHERE {S.WAITING.sql()} AND queue IN (SELECT name FROM q) GROUP BY queue
)
SELECT q.name, COALESCE(pending.n, 0), COALESCE(claimed.n, 0), COALESCE(retrying.n, 0), COALESCE(dead.n, 0),
    pending.oldest, EXTRACT(EPOCH FROM now() - pending.oldest)::double precision, COALESCE(scheduled.n, 0),
    COALESCE(cancelled.n, 0), r.paused, r.max_claimed, r.rate_per_second, r.rate_burst, COALESCE(waiting.n, 0)
FROM q
JOIN todos_queue r ON r.name = q.name
LEFT JOIN pending ON pending.queue = q.name
LEFT JOIN claimed ON claimed.queue = q.name
LEFT JOIN retrying ON retrying.queue = q.name
LEFT JOIN dead ON dead.queue = q.name
LEFT JOIN scheduled ON scheduled.queue = q.name
LEFT JOIN cancelled ON cancelled.queue = q.name
LEFT JOIN waiting ON waiting.queue = q.name
ORDER BY q.name
"""

# seconds_until_claimable (the long-poll, todos/longpoll.py): seconds (by the database's clock) until the
# earliest lease in the caller's queues lapses, the earliest scheduled retry comes due, or the earliest
# scheduled todo's run_at comes: work that becomes claimable with no write and so no NOTIFY. Negative
# when such work is claimable already; NULL when there is none. Same queue set and assignee rule as
# CLAIM_NEXT; paused queues are left out (resume notifies). The scheduled and retry branches are one
# descent per queue of todo_scheduled_due and todo_retry_queue_due (the first entry is that queue's
# earliest run_at or next_retry_at), so a million todos scheduled for later, or other queues' retries,
# cost it nothing; an assignee filter may walk past the other agents' rows. The retry branch orders
# NULLS FIRST (next_retry_at is never null there: the same order), which only todo_retry_queue_due yields,
# as the claim's pending scan does: ordered plainly, the planner walked todo_retry_due's global order,
# expecting its queue's first retry within a few entries, and stepped over every other queue's earlier
# retries (todos/tests/test_read_plans.py). Queue
# controls add two moments, for limited queues with pending work:
#  * a rate-limited one: when its bucket next holds a whole token (tokens refill with no write);
#  * one at its max_claimed: now (0), so the waiter re-polls with backoff (up to
#    waiting.FALLBACK_POLL_SECONDS). A complete or fail that frees a slot does not notify: that would cost
#    every completion of every queue a lookup, and the completing worker usually claims again itself.
#  * one with max_claimed_per_key (issue 22): now, likewise. Its pending work may all be behind keys at
#    their cap, and a complete that frees a key's slot does not notify either. Telling which keys are full
#    would count every key's leases; a claim that found nothing is the cheaper check, and the backoff
#    bounds how often it runs. Plain queues read nothing more for it: the column is on the row read anyway.
#  * one whose most urgent pending todo is held by named limits (issue 31, its own or its queue's): the end
#    of the latest park among them (a quota wall resets with no write), else now (a full limit, as at
#    max_claimed). One descent of todo_pending_claim_scan per queue, and the head's limit rows.
SECONDS_UNTIL_CLAIMABLE = f"""
WITH queues AS (
    SELECT name, max_claimed, rate_per_second, rate_burst, tokens, refilled_at, max_claimed_per_key, limits
    FROM todos_queue
    WHERE name LIKE ANY(%(scopes)s::text[]) AND name LIKE ANY(%(wanted)s::text[]) AND NOT paused
),
waiting AS (
    SELECT queues.* FROM queues
    WHERE (max_claimed IS NOT NULL OR rate_per_second IS NOT NULL OR max_claimed_per_key IS NOT NULL) AND EXISTS (
        SELECT 1 FROM todos_todo t WHERE {S.PENDING.sql("t")} AND t.queue = queues.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s))
)
SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(t.lease_expires_at) FROM todos_todo t
     WHERE {(S.CLAIMED & S.BELOW_CAP).sql("t")} AND t.queue IN (SELECT name FROM queues)
       AND (t.assignee IS NULL OR t.assignee = %(agent)s)),
    (SELECT min(r.next_retry_at) FROM queues CROSS JOIN LATERAL (
        SELECT t.next_retry_at FROM todos_todo t
        WHERE {S.RETRY_WAITING.sql("t")} AND t.queue = queues.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.next_retry_at NULLS FIRST LIMIT 1
    ) r),
    (SELECT min(s.run_at) FROM queues CROSS JOIN LATERAL (
        SELECT t.run_at FROM todos_todo t
        WHERE {S.SCHEDULED.sql("t")} AND t.queue = queues.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.run_at LIMIT 1
    ) s),
    (SELECT min(w.refilled_at + make_interval(secs => GREATEST(1 - w.tokens, 0) / w.rate_per_second))
     FROM waiting w WHERE w.rate_per_second IS NOT NULL),
    (SELECT min(CASE WHEN todos_live_leases(w.name) >= w.max_claimed THEN now() END)
     FROM waiting w WHERE w.max_claimed IS NOT NULL),
    (SELECT min(now()) FROM waiting w WHERE w.max_claimed_per_key IS NOT NULL),
    (SELECT min(COALESCE(b.until, now())) FROM queues CROSS JOIN LATERAL (
        SELECT t.limits FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = queues.name AND (t.assignee IS NULL OR t.assignee = %(agent)s)
        ORDER BY t.priority, t.run_at NULLS FIRST LIMIT 1
    ) head CROSS JOIN LATERAL (
        SELECT max(l.parked_until) FILTER (WHERE {flow.parked("l")}) AS until FROM todos_limit l
        WHERE l.name = ANY({flow.held_by("head.limits", "queues.limits")})
    ) b
    WHERE head.limits IS NOT NULL OR queues.limits IS NOT NULL)
) - now())::double precision
"""

# The dashboard's completions and failures per queue and minute over the last %(minutes)s minutes
# (todos/dashboard.py): range scans of todo_done_recent and todo_failed_recent (dead-letters), and the
# retry-waiting rows through todo_retry_due, filtered on updated_at: they are live work, not history, and
# todo_failed_recent leaves them out so that the claim's due-retry branch can never use it (migration 0042).
PER_MINUTE = f"""
SELECT queue, 'done' AS what, date_trunc('minute', completed_at) AS minute, count(*) FROM todos_todo
WHERE {S.DONE.sql()} AND completed_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY 1, 3
UNION ALL
SELECT queue, 'failed', date_trunc('minute', updated_at), count(*) FROM (
    SELECT queue, updated_at FROM todos_todo
    WHERE {S.DEAD_LETTER.sql()} AND updated_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
    UNION ALL
    SELECT queue, updated_at FROM todos_todo
    WHERE {S.RETRY_WAITING.sql()} AND updated_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
) failed
GROUP BY 1, 3
"""


# GET /api/v1/todos/<id>/tree/ (todos/selectors.py, tree_page): one page of a tree in (depth, id) order, after
# the cursor (%(after_depth)s, %(after_id)s; -1 and '' for the first page, which starts with the todo itself).
# Nodes outside the caller's scopes (%(visible)s) are left out; their children are not.
# TREE_OF_ROOT, the tree of a root: the root by its primary key, then one range of todo_tree (root_id, depth,
# id) from the cursor, stopping at the page's %(limit)s: any size of tree pages at the cost of its page.
TREE_OF_ROOT = f"""
(SELECT id, parent_id, 0, state, ({S.DEAD_LETTER.sql()}), queue, kind, title FROM todos_todo
 WHERE id = %(id)s::text AND %(after_depth)s::int < 0 AND queue LIKE ANY(%(visible)s::text[]))
UNION ALL
(SELECT id, parent_id, depth, state, ({S.DEAD_LETTER.sql()}), queue, kind, title FROM todos_todo
 WHERE root_id = %(id)s::text AND (depth, id) > (%(after_depth)s::int, %(after_id)s::text)
   AND queue LIKE ANY(%(visible)s::text[])
 ORDER BY depth, id LIMIT %(limit)s::int)
LIMIT %(limit)s::int
"""

# TREE_WALK, the subtree of a todo below its root (which todo_tree cannot range over): walked from the todo,
# parent to children (todo_children, one probe per node), up to %(walk)s::int nodes (limits.MAX_TREE_WALK: the walk
# runs again for every page), then ordered as above. The last column says the walk stopped at its bound.
TREE_WALK = f"""
WITH RECURSIVE walk(id) AS (
    SELECT id FROM todos_todo WHERE parent_id = %(id)s::text
    UNION ALL
    SELECT c.id FROM walk JOIN todos_todo c ON c.parent_id = walk.id
),
bounded AS MATERIALIZED (SELECT id FROM walk LIMIT %(walk)s::int + 1),
nodes AS (
    SELECT id, parent_id, depth, state, ({S.DEAD_LETTER.sql()}) AS dead, queue, kind, title
    FROM todos_todo WHERE id = %(id)s::text AND %(after_depth)s::int < 0
    UNION ALL
    SELECT t.id, t.parent_id, t.depth, t.state, ({S.DEAD_LETTER.sql("t")}), t.queue, t.kind,
        t.title
    FROM (SELECT id FROM bounded LIMIT %(walk)s::int) b JOIN todos_todo t ON t.id = b.id
    WHERE (t.depth, t.id) > (%(after_depth)s::int, %(after_id)s::text)
)
SELECT nodes.*, (SELECT count(*) FROM bounded) > %(walk)s::int FROM nodes
WHERE queue LIKE ANY(%(visible)s::text[])
ORDER BY depth, id LIMIT %(limit)s::int
"""
