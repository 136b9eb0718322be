"""Queue controls (todos/controls.py).

Each is one UPDATE of the queue's row in todos_queue, which every claim reads (CLAIM_NEXT's
_queue_quotas): a change holds for every process from its next claim. A limited queue's row is locked
by its claims for the length of one claim statement, so a change waits at most that long.
"""

from todos import states as S
from todos.sql.claim import reservable
from todos.sql.common import NOTIFY_CHANNEL

_QUEUE_COLUMNS = """name, paused, max_claimed, rate_per_second, rate_burst, fair, fair_weights, max_claimed_per_key,
    max_depth, max_children, max_descendants, limits, rate_per_key"""


# A queue change may make many todos claimable at once, and a notification wakes one waiter per count
# (todos/longpoll.py), so it says "<queue> <n>": n the queue's claimable todos, counted up to this many
# (enough for every waiter a process holds at once; a waiter left asleep still wakes when its wait ends).
_QUEUE_WAKES_MAX = 1000


def _notifying_queue(changed: str, also: str = "") -> str:
    """Like _notifying, for todos_queue: wakes as many long-polls of the queue that changed as it has
    claimable todos (at least one, at most _QUEUE_WAKES_MAX). ``also``: more CTEs run beside it."""
    return f"""
WITH changed AS ({changed}),{also}
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', c.name || ' ' || GREATEST(1, (
        SELECT count(*) FROM (
            SELECT 1 FROM todos_todo t WHERE t.queue = c.name AND {S.CLAIMABLE.sql("t")} LIMIT {_QUEUE_WAKES_MAX}
        ) claimable)))
    FROM changed c
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# pause: claims skip the queue from their next statement; creates still land. Leases already held run on.
PAUSE_QUEUE = f"""
UPDATE todos_queue SET paused = true WHERE name = %(name)s AND name LIKE ANY(%(visible)s::text[])
RETURNING {_QUEUE_COLUMNS}
"""

# resume: notifies, so the long-polls waiting on the queue claim at once.
RESUME_QUEUE = _notifying_queue(f"""
UPDATE todos_queue SET paused = false WHERE name = %(name)s AND name LIKE ANY(%(visible)s::text[])
RETURNING {_QUEUE_COLUMNS}
""")

# set limits: each control changes only if given (%(set_*)s), fair share's three (issue 22) too; setting the
# rate or the burst starts the bucket full (a change grants one burst). The burst defaults to one second's
# worth. Notifies: a raised or removed limit may let waiters through.
SET_QUEUE_LIMITS = _notifying_queue(
    """
UPDATE todos_queue q SET
    max_claimed = CASE WHEN %(set_max_claimed)s THEN %(max_claimed)s::integer ELSE q.max_claimed END,
    fair = CASE WHEN %(set_fair)s THEN %(fair)s::boolean ELSE q.fair END,
    fair_weights = CASE WHEN %(set_fair_weights)s THEN %(fair_weights)s::jsonb ELSE q.fair_weights END,
    max_claimed_per_key = CASE WHEN %(set_max_claimed_per_key)s THEN %(max_claimed_per_key)s::integer
        ELSE q.max_claimed_per_key END,
    max_depth = CASE WHEN %(set_max_depth)s THEN %(max_depth)s::integer ELSE q.max_depth END,
    max_children = CASE WHEN %(set_max_children)s THEN %(max_children)s::integer ELSE q.max_children END,
    max_descendants = CASE WHEN %(set_max_descendants)s THEN %(max_descendants)s::integer
        ELSE q.max_descendants END,
    -- named limits (issue 31) every todo of the queue is held by; NULL for none (an empty list too)
    rate_per_key = CASE WHEN %(set_rate_per_key)s THEN %(rate_per_key)s::double precision ELSE q.rate_per_key END,
    limits = CASE WHEN %(set_limits)s THEN NULLIF(%(limits)s::text[], '{}') ELSE q.limits END,
    rate_per_second = want.rate,
    rate_burst = want.burst,
    tokens = CASE WHEN want.rate IS NULL THEN NULL WHEN %(set_rate)s OR %(set_burst)s OR q.tokens IS NULL
        THEN want.burst ELSE q.tokens END,
    refilled_at = CASE WHEN want.rate IS NULL THEN NULL WHEN %(set_rate)s OR %(set_burst)s OR q.tokens IS NULL
        THEN now() ELSE q.refilled_at END
FROM todos_queue cur CROSS JOIN LATERAL (
    SELECT r.rate, CASE WHEN r.rate IS NULL THEN NULL ELSE COALESCE(
        CASE WHEN %(set_burst)s THEN %(rate_burst)s::integer ELSE cur.rate_burst END,
        GREATEST(1, ceil(r.rate))::integer) END AS burst
    FROM (SELECT CASE WHEN %(set_rate)s THEN %(rate_per_second)s::double precision ELSE cur.rate_per_second END
          AS rate) r
) want
WHERE q.name = %(name)s AND cur.name = q.name AND q.name LIKE ANY(%(visible)s::text[])
RETURNING q.name, q.paused, q.max_claimed, q.rate_per_second, q.rate_burst, q.fair, q.fair_weights,
    q.max_claimed_per_key, q.max_depth, q.max_children, q.max_descendants, q.limits, q.rate_per_key
""",
    # A queue that becomes keyed registers the keys of its pending todos (the todo table's triggers register
    # the keys of those to come, todos/migrations/0016). The claim also registers the key at its queue's head,
    # so one whose create committed while this ran is served all the same.
    also=f"""
registered AS (
    INSERT INTO todos_fairkey (queue, key, vtime)
    SELECT DISTINCT t.queue, t.fair_key, 0 FROM changed c JOIN todos_todo t ON t.queue = c.name
    WHERE (c.fair OR c.max_claimed_per_key IS NOT NULL) AND {S.PENDING.sql("t")}
    ON CONFLICT DO NOTHING
),""",
)

# After SET_QUEUE_LIMITS, in its transaction (controls.set_limits): a queue that is not reservable (issue 31: fair
# off, a cap, a rate, a per-key control, limits) forgets its reserved todos, and the fair walk finds them again.
# A statement of its own, so that its snapshot is taken after SET_QUEUE_LIMITS waited for the queue's row: a fair
# turn that held the row meanwhile committed reservations that statement's snapshot does not show, and they would
# be left where neither the walk (it skips them) nor CLAIM_FAIR_READY (the queue is no longer reservable) takes
# them. This transaction holds the queue's row until commit, so no turn reserves on the old settings after it;
# CLAIM_FAIR_READY skips the rows it deletes (locked, then gone). Guard: the queue's row, read after the update;
# index: fair_ready_claim's leading column.
FORGET_RESERVATIONS = f"""
DELETE FROM todos_fairready r USING todos_queue q
WHERE q.name = %(name)s AND r.queue = q.name AND NOT {reservable("q")}
"""

# One queue's controls (the API's answers, and a miss: absent or out of scope is not found).
QUEUE_CONTROLS = f"""
SELECT {_QUEUE_COLUMNS} FROM todos_queue WHERE name = %(name)s AND name LIKE ANY(%(visible)s::text[])
"""
