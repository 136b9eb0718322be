"""What the statements of several modules of todos/sql/ share (a fragment that one module uses lives in
that module). It imports no other module of the package.
"""

from todos import limits
from todos import states as S

_TODO_COLUMNS = """id, queue, source, kind, title, payload, event_id, idempotency_key, assignee, state, owner,
    lease_expires_at, attempt, max_attempts, result, created_at, updated_at, claimed_at, completed_at,
    next_retry_at, lease_id, errors, run_at, priority, waiting_for, resolution, progress, checkpoint,
    traceparent, fair_key, depends_on, dependencies_left, on_dependency_failure, has_dependents, parent_id,
    root_id, depth, descendants, spawn_caps, callback, limits, expires_at, children, cascade, revoked_lease_id,
    late_result, usage, tree_usage, budget, budget_exhausted, a2a_push"""
# Every statement that hands back todos returns these columns, in this order: todos/queue/ builds
# Todos from them by position.
TODO_COLUMNS = _TODO_COLUMNS


# The caller holds the current receipt. A receipt stays current until the todo is claimed again
# (which issues a new lease_id) or is completed, failed, released or retried by an operator
# (which clear it); a lapse alone does not void it, so a slow worker whose todo has not been
# re-claimed may still heartbeat, complete or fail it (SPEC decision 2), whether or not the
# reaper has swept it yet.
#
# The holder's agent is tested on COALESCE(owner, ''), never on owner itself (issue 32): a test strict in owner
# (split_part(owner, ...) = x) implies owner IS NOT NULL, so the planner may serve the statement from the
# partial todo_admin_owner_recent (owner, created_at) WHERE owner IS NOT NULL, which it estimates empty
# after a backlog is loaded and analyzed (no todo owned yet), instead of the primary key. A prepared
# statement keeps that generic plan: each complete then walked every owned row (done ones keep their
# owner), ~0.5 ms of PostgreSQL CPU per claim + complete at 3,000 completions (bench/claim/pg_cpu.py). Not
# strict, the test proves nothing about owner, and id's primary key is the only index left to use. An
# agent's name is never empty, so a NULL owner matches no agent as before.
def holder_is(alias: str = "") -> str:
    """The row's owner is one of the caller's workers (%(agent)s/...), written so no index on owner can serve
    the statement (above)."""
    owner = f"{alias}.owner" if alias else "owner"
    return f"split_part(COALESCE({owner}, ''), '/', 1) = %(agent)s"


_HOLDS_RECEIPT = f"""id = %(id)s AND lease_id = %(lease_id)s AND {holder_is()}
    AND queue LIKE ANY(%(visible)s::text[])"""

# A todo's errors keep their last ERRORS_KEPT entries (issue 28): every statement that appends writes
# jsonb_path_query_array(<errors and the new entries>, _ERRORS_KEPT), so a todo that waits or is re-claimed
# again and again keeps a bounded history. The jsonpath slice clamps to the array's bounds.
_ERRORS_KEPT = f"'$[last - {limits.ERRORS_KEPT - 1} to last]'"


# Transitions that make work claimable at once NOTIFY this channel with the queue's name, inside
# their own statement (no extra round trip); todos/longpoll.py wakes that many long-polling claims of
# that queue (a statement that changed n > 1 rows of a queue says "<queue> <n>"). A NOTIFY is
# delivered when the transaction commits, so a woken claimer sees the row, and PostgreSQL
# folds identical (channel, payload) pairs of one transaction into one.
NOTIFY_CHANNEL = "switchboard_todos"


# What a finishing row hands its dependents: NULL while it can still run (retry-waiting included).
_OUTCOME = f"""CASE WHEN {S.DONE.sql()} THEN 'done' WHEN {S.CANCELLED.sql()} THEN 'cancelled'
    WHEN {S.DEAD_LETTER.sql()} THEN 'dead-letter' END"""

# Part of a statement whose CTE ``changed`` returns _TODO_COLUMNS: settles the dependents of the rows it
# finished. has_dependents is read from the row as updated (the latest version: set by a create that held
# the lock this statement waited for), so a todo nobody depends on costs no call and no edge lookup.
_SETTLED = f"""settled AS MATERIALIZED (
    SELECT todos_settle_dependents(array_agg(id), array_agg({_OUTCOME})) FROM changed
    WHERE has_dependents AND ({_OUTCOME}) IS NOT NULL
    HAVING count(*) > 0
)"""


def _notifying(changed: str, when: str = "true") -> str:
    """Wrap a data-modifying statement (``changed``, with RETURNING queue, ...) so that it also
    notifies each distinct queue of the rows that satisfy ``when``, with their count when more than
    one; it returns the same rows."""
    return f"""
WITH changed AS ({changed}),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM changed WHERE {when} GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# A resolved todo is runnable at once (scheduled instead if a dependency of a future run_at, never
# claimed, is what it waited for: that is the only shape a scheduled todo may have). ``by`` and ``detail``
# are SQL: who resolved it and the jsonb merged into its resolution. A wait on todos resolved another way
# keeps its open edges until they settle (counting nothing off: it no longer waits) or its next wait
# deletes them; its count goes, so dependencies_left is only ever set while a todo waits on edges.
# todos_settle_dependents (migration 0020) resolves a wait on todos the same way, written out there.
def _resolved_set(by: str, detail: str = "'{}'::jsonb") -> str:
    """The SET list that resolves a waiting todo (alias t)."""
    return f"""
    state = CASE WHEN t.run_at > now() AND t.owner IS NULL THEN '{S.TodoState.SCHEDULED}'
        ELSE '{S.TodoState.PENDING}' END,
    waiting_for = NULL,
    dependencies_left = 0,
    resolution = jsonb_build_object('by', {by}, 'at', now()) || {detail},
    errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', 'wait resolved', 'by', {by})), {_ERRORS_KEPT}),
    updated_at = now()"""


def _finishing(changed: str, *, notify_when: str = "false", before: str = "", after: str = "") -> str:
    """Wrap a data-modifying statement (``changed``, RETURNING at least id, queue, state, next_retry_at and
    has_dependents) whose rows may finish todos that others depend on or wait for: it settles them in the
    same statement (_SETTLED: the edges of dependencies made at create and of holders' waits on todos alike,
    whose dependent rows may be newer than this statement's snapshot). Notifies the queues of ``changed``'s
    rows that satisfy ``notify_when`` (the function notifies those of the todos it moves); returns
    ``changed``'s rows. ``before``: CTEs that ``changed`` reads (a WITH cannot nest a data-modifying one);
    ``after``: CTEs (each ending with a comma) that read ``changed``, run to completion whether read or not."""
    return f"""
WITH {before}changed AS ({changed}),
{_SETTLED},{after}
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM changed WHERE {notify_when} GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
    CROSS JOIN (SELECT count(*) FROM settled) s
"""


_RETURNING_T = ", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))
