"""What the statements of several modules of todos/sql/ share (a fragment that one module uses lives in
that module). It imports no other module of the package.
"""

from todos import states as S

_TODO_COLUMNS = """id, queue, source, kind, title, payload, event_id, idempotency_key, assignee, state, owner,
    lease_expires_at, attempt, max_attempts, result, created_at, updated_at, claimed_at, completed_at,
    next_retry_at, lease_id, errors, run_at, priority, waiting_for, resolution, awaited_by, awaited_left,
    progress, checkpoint, traceparent, fair_key, depends_on, dependencies_left, on_dependency_failure, has_dependents"""
# Every statement that hands back todos returns these columns, in this order: todos/queue.py builds
# Todos from them by position.
TODO_COLUMNS = _TODO_COLUMNS

# The caller holds the current receipt. A receipt stays current until the todo is claimed again
# (which issues a new lease_id) or is completed, failed, released or retried by an operator
# (which clear it); a lapse alone does not void it, so a slow worker whose todo has not been
# re-claimed may still heartbeat, complete or fail it (SPEC decision 2), whether or not the
# reaper has swept it yet.
_HOLDS_RECEIPT = """id = %(id)s AND lease_id = %(lease_id)s AND split_part(owner, '/', 1) = %(agent)s
    AND queue LIKE ANY(%(visible)s::text[])"""

# Transitions that make work claimable at once NOTIFY this channel with the queue's name, inside
# their own statement (no extra round trip); todos/waiting.py wakes that many long-polling claims of
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
# are SQL: who resolved it and the jsonb merged into its resolution.
def _resolved_set(by: str, detail: str = "'{}'::jsonb", alias: str = "t", when: str | None = None) -> str:
    """The SET list that resolves a waiting todo; with ``when``, only rows for which it holds (others keep
    their values: for a statement that also updates rows it does not resolve)."""

    def only(value: str, column: str) -> str:
        return value if when is None else f"CASE WHEN {when} THEN {value} ELSE {alias}.{column} END"

    state = (
        f"CASE WHEN {alias}.run_at > now() AND {alias}.owner IS NULL THEN '{S.TodoState.SCHEDULED}' "
        f"ELSE '{S.TodoState.PENDING}' END"
    )
    entry = f"""{alias}.errors || jsonb_build_array(jsonb_build_object(
        'attempt', {alias}.attempt, 'at', now(), 'error', 'wait resolved', 'by', {by}))"""
    return f"""
    state = {only(state, "state")},
    waiting_for = {only("NULL", "waiting_for")},
    resolution = {only(f"jsonb_build_object('by', {by}, 'at', now()) || {detail}", "resolution")},
    errors = {only(entry, "errors")},
    updated_at = {only("now()", "updated_at")}"""


# For the hook below, on a waiter p (its latest version) and f.ids, the todos of this statement that
# finished and name p in their awaited_by: whether its current wait is for any of them (awaited_left is
# set by each wait on todos and cleared by any other wait, so an edge left by an earlier wait counts for
# nothing), what is left once they are taken off, and whether that is nothing.
_COUNTS = f"({S.WAITING.sql('p')} AND p.awaited_left && f.ids)"
_LEFT = "ARRAY(SELECT x FROM unnest(p.awaited_left) x WHERE x <> ALL(f.ids))::varchar(40)[]"
_RESOLVES = f"({_COUNTS} AND cardinality({_LEFT}) = 0)"


def _finishing(changed: str, *, finished: str, notify_when: str = "false", before: str = "") -> str:
    """Wrap a data-modifying statement (``changed``, RETURNING at least id, queue and awaited_by) whose
    rows may finish todos that others wait for (``finished``: a condition on its rows, alias c). In the
    same statement each waiter named in a finished row's awaited_by takes it off its awaited_left; one
    left with nothing becomes pending (resolution by "todos"). Notifies the queues of ``changed``'s rows
    that satisfy ``notify_when`` and of every todo it woke; returns ``changed``'s rows. ``before``: CTEs
    that ``changed`` reads (a WITH cannot nest a data-modifying one).

    Why this cannot miss a wake: awaited_by comes from the row this statement updated, in its latest
    version (a statement that waited for a lock re-reads the row), and queue.wait writes the edge by
    updating that row. So either the wait's write came first and the finishing statement sees the edge,
    or the finish came first and the wait, re-reading the row under its lock, counts it finished. The
    waiter's row is found by id, and its latest version is what the CASEs read (its state, its list):
    siblings finishing concurrently take its lock in turn and each takes itself off the last list. Most todos
    have no awaited_by: the hook then costs nothing but an empty unnest.

    It also settles the dependents of the todos it finished (_SETTLED: dependencies made at create, whose
    dependent rows may be newer than this statement's snapshot); ``changed`` then returns state,
    next_retry_at and has_dependents too."""
    return f"""
WITH {before}changed AS ({changed}),
woken AS (
    UPDATE todos_todo p SET
        awaited_left = CASE WHEN {_COUNTS} THEN {_LEFT} ELSE p.awaited_left END,
        {_resolved_set("'todos'", "jsonb_build_object('todos', p.waiting_for->'todos')", "p", when=_RESOLVES)}
    FROM (
        SELECT w.waiter, array_agg(c.id) AS ids
        FROM changed c CROSS JOIN LATERAL unnest(c.awaited_by) AS w(waiter)
        WHERE {finished}
        GROUP BY w.waiter
    ) f
    WHERE p.id = f.waiter AND p.id NOT IN (SELECT id FROM changed)
    RETURNING p.queue, p.state
),
{_SETTLED},
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM (
        SELECT queue FROM changed WHERE {notify_when}
        UNION ALL SELECT queue FROM woken WHERE {S.PENDING.sql("woken")}
    ) q GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
    CROSS JOIN (SELECT count(*) FROM settled) s
"""


_RETURNING_T = ", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))
