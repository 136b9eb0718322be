"""What a receipt's holder does with its lease: heartbeat, complete, fail, release; and CURRENT_STATE,
which tells a refused transition's not found from its conflict.
"""

from todos import states as S
from todos.sql.common import _ERRORS_KEPT, _HOLDS_RECEIPT, _TODO_COLUMNS, _finishing, _notifying, holder_is
from todos.sql.trees import BUDGET_OPEN, ROLLED_UP, USAGE_SET, ancestors_first

# heartbeat: extend the lease. With the current receipt this also takes back a lapsed todo that was
# not re-claimed meanwhile (state claimed again; attempt unchanged: it is the same receive), but not one
# the reaper dead-lettered at its cap: only an operator revives a dead-letter (SPEC decision 1).
# Such a revival makes one more live lease in its queue, so it obeys the queue's controls as a claim
# does: never in a paused queue, never past max_claimed (counted by todos_live_leases() under the
# queue row's lock, as _queue_quotas counts). Rate limits meter new work handed out; a revival hands
# out none (the same receive, the same attempt), so it takes no token. Refused, it changes nothing:
# queue.heartbeat answers 409 with the reason. A live lease's heartbeat reads no queue row.
_REVIVED_QUEUE = f"""(SELECT r.queue FROM todos_todo r
    WHERE r.id = %(id)s AND r.lease_id = %(lease_id)s AND NOT ({S.LIVE_LEASE.sql("r")}))"""
# Progress and checkpoint (NULL: not sent, keep the last) are written only under the receipt, so a
# stale worker can never overwrite the current attempt's.
HEARTBEAT = f"""
WITH revival AS MATERIALIZED (
    SELECT q.name, q.paused, q.max_claimed, q.max_claimed_per_key FROM todos_queue q WHERE q.name = {_REVIVED_QUEUE}
    FOR NO KEY UPDATE OF q
),
-- max_claimed_per_key too (issue 22): the key is locked as a claim by id locks it (todos_fair_lock_key).
may_revive AS MATERIALIZED (
    SELECT NOT paused AND (max_claimed IS NULL OR todos_live_leases(name) < max_claimed)
        AND (max_claimed_per_key IS NULL OR EXISTS (SELECT FROM todos_fair_lock_key(
            name, (SELECT fair_key FROM todos_todo WHERE id = %(id)s), max_claimed_per_key, true))) AS ok
    FROM revival
)
UPDATE todos_todo SET
    state = 'claimed',
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    next_retry_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress),
    checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint),
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND (({S.LIVE_LEASE.sql()})
    OR (({(S.CLAIMED | S.PENDING).sql()}) AND COALESCE((SELECT ok FROM may_revive), false)))
RETURNING {_TODO_COLUMNS}
"""


_REPORTED = "%(usage)s::jsonb IS NOT NULL"


def _ancestors_first(statement: str, when: str, parent_when: str = "false", row: str = "todos_todo") -> str:
    """``statement`` (an UPDATE under the receipt) locking the todo's ancestors first (trees.ancestors_first)."""
    where = f"WHERE {_HOLDS_RECEIPT} AND"
    assert statement.count(where) == 1, statement
    return statement.replace(where, f"{where} {ancestors_first(row, when, parent_when)} AND", 1)


def _with_usage(statement: str, after: str) -> str:
    """``statement`` with USAGE_SET in its SET list, right after ``after`` (its last item, or an item with its
    comma): issue 30's usage, added to the todo's under the receipt."""
    assert statement.count(after) == 1, after
    item = after.removesuffix(",")
    return statement.replace(after, f"{item},{USAGE_SET}" + ("," if after.endswith(",") else ""))


# heartbeat with usage (issue 30, todos/sql/trees.py): HEARTBEAT that also adds %(usage)s to the todo's usage
# and, in this statement, rolls it up to its root's (ROLLED_UP), having locked the root first (ancestors_first:
# a tree's lock order, ancestors first). A heartbeat without usage runs HEARTBEAT, unchanged.
HEARTBEAT_USAGE = (
    _ancestors_first(_with_usage(HEARTBEAT, "    checkpoint = COALESCE(%(checkpoint)s::jsonb, checkpoint),"), _REPORTED)
    .replace("\n)\nUPDATE todos_todo SET", "\n),\nchanged AS (\nUPDATE todos_todo SET", 1)
    .rstrip()
    + f"""
),
{ROLLED_UP.rstrip().removesuffix(",")}
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM rolled) r
"""
)

# The states a receipt's holder may finish from: all but done. A todo the reaper requeued (pending) or
# dead-lettered at its cap (failed) keeps the lapsed receipt until someone else claims it.
_UNFINISHED = S.CLAIMED | S.PENDING | S.FAILED

# complete: -> done.
_COMPLETE = f"""
UPDATE todos_todo SET
    state = 'done',
    result = %(result)s,
    completed_at = now(),
    updated_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL
WHERE {_HOLDS_RECEIPT} AND {_UNFINISHED.sql()}
RETURNING {_TODO_COLUMNS}
"""
# Locking the tree's root and the todo's parent first when others wait for it (ancestors_first: the settle of a
# fan-in locks its waiting parent after the todo); a todo outside any tree, or that nobody waits for, runs
# nothing more (two column tests).
_WAITED_FOR = "todos_todo.has_dependents"
COMPLETE = _finishing(_ancestors_first(_COMPLETE, _WAITED_FOR, _WAITED_FOR))
# complete with usage (issue 30): COMPLETE that also adds %(usage)s to the todo's usage and its root's
# (ROLLED_UP), in the same statement, the root (and the parent, when others wait for it) locked first
# (ancestors_first). A complete without usage runs COMPLETE.
COMPLETE_USAGE = _finishing(
    _ancestors_first(_with_usage(_COMPLETE, "    next_retry_at = NULL"), f"{_REPORTED} OR {_WAITED_FOR}", _WAITED_FOR),
    after=ROLLED_UP,
)

# complete many: one statement for a batch of (id, lease_id, result); rows that come back were completed.
COMPLETE_MANY = _finishing(
    f"""
UPDATE todos_todo t SET
    state = 'done',
    result = items.result,
    completed_at = now(),
    updated_at = now(),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL
FROM unnest(%(ids)s::text[], %(lease_ids)s::text[], %(results)s::jsonb[]) AS items(id, lease_id, result)
WHERE t.id = items.id AND t.lease_id = items.lease_id AND {holder_is("t")}
  AND t.queue LIKE ANY(%(visible)s::text[]) AND {_UNFINISHED.sql("t")}
RETURNING {", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))}
""",
)

# fail: -> failed (notifies when the retry is due at once, e.g. retry_in 0). Below the cap a retry is
# scheduled: after %(retry_in)s seconds if the caller gave it, else exponential backoff with full
# jitter, random() * min(cap, base * 2^(attempt-1)). At the cap next_retry_at stays NULL: a
# dead-letter (SPEC decision 4).
# A dead-letter (at the cap) settles its dependents as a complete does: the same ancestors first.
_DEAD_LETTERS = f"t.has_dependents AND NOT ({S.BELOW_CAP.sql('t')})"
FAIL = _finishing(
    _ancestors_first(
        f"""
UPDATE todos_todo t SET
    state = 'failed',
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', %(error)s::text)), {_ERRORS_KEPT}),
    next_retry_at = CASE WHEN {S.BELOW_CAP.sql("t")} THEN now() + make_interval(secs => COALESCE(
        %(retry_in)s::double precision,
        random() * LEAST(%(backoff_cap)s::double precision,
                         %(backoff_base)s::double precision * power(2, GREATEST(t.attempt, 1) - 1))))
        END,
    lease_id = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND {_UNFINISHED.sql("t")}
RETURNING {_TODO_COLUMNS}
""",
        _DEAD_LETTERS,
        _DEAD_LETTERS,
        row="t",
    ),
    notify_when=S.RETRY_DUE.sql(),
)

# Owner and claimed_at are the last claim's ("last claimed by"): set by every claim and left alone by
# every other transition (release, lapse, fail, complete, operator steps), so a released and a lapsed
# todo look alike. Only the receipt (lease_id) says whether a claim is still held.

# release: -> pending, handing the attempt back (a voluntary release costs no retry budget). Not from
# a dead-letter: handing back a lease the reaper dead-lettered at its cap would make it claimable again.
# Notifies.
RELEASE = _notifying(f"""
UPDATE todos_todo SET
    state = 'pending',
    attempt = GREATEST(attempt - 1, 0),
    lease_id = NULL,
    lease_expires_at = NULL,
    next_retry_at = NULL,
    updated_at = now()
WHERE {_HOLDS_RECEIPT} AND {(S.CLAIMED | S.PENDING).sql()}
RETURNING {_TODO_COLUMNS}
""")

# Classifies a guarded UPDATE that touched no row: absent or invisible -> not found, else conflict (a
# claim refused by its queue's controls, or by its tree's spent budget, says so).
CURRENT_STATE = f"""
SELECT t.state, {S.DEAD_LETTER.sql("t")} AS dead_letter, t.lease_id, split_part(t.owner, '/', 1) AS owner_agent,
    q.paused, (q.max_claimed IS NOT NULL OR q.rate_per_second IS NOT NULL) AS limited,
    NOT {BUDGET_OPEN} AS budget_spent, t.errors -> -1 ->> 'reason' AS last_reason
FROM todos_todo t LEFT JOIN todos_queue q ON q.name = t.queue
WHERE t.id = %(id)s AND t.queue LIKE ANY(%(visible)s::text[])
"""
