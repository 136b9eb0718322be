"""Waits (issue 20): the waiting state and its waitpoints (todos/waitpoints.py).

A todo waits with an open row in todos_waitpoint (resolved_at NULL). Every way out of waiting closes
that row and moves the todo in ONE statement: the row's lock decides the race, so of two resolvers (two
token resolves, a resolve and the timeout, two deliveries) exactly one closes it and moves the todo;
the other finds resolved_at set when it re-reads the locked row and changes nothing.
"""

from todos import states as S
from todos.sql.common import (
    _ERRORS_KEPT,
    _HOLDS_RECEIPT,
    _OUTCOME,
    _RETURNING_T,
    NOTIFY_CHANNEL,
    _finishing,
    _resolved_set,
)

# wait (the holder): claimed (or pending with its lapsed receipt, as release) -> waiting, giving the
# lease and the attempt back, and opens its waitpoint (a new wait replaces the todo's last one). Guard:
# the receipt; lock: the row. dependencies_left: how many todos a wait on todos waits for (their edges,
# LINK_WAIT, come first in the same transaction), else 0. %(unlink)s (every wait but one on todos, whose
# LINK_WAIT does it): the todo's edges left by an earlier wait go, so they count nothing off this one.
WAIT = f"""
WITH changed AS (
    UPDATE todos_todo t SET
        state = '{S.TodoState.WAITING}',
        attempt = GREATEST(t.attempt - 1, 0),
        lease_id = NULL,
        lease_expires_at = NULL,
        next_retry_at = NULL,
        waiting_for = %(waiting_for)s,
        resolution = NULL,
        dependencies_left = %(awaited)s,
        errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
            'attempt', t.attempt, 'at', now(), 'error', 'waiting', 'for', %(waiting_for)s::jsonb,
            'timeout_seconds', %(timeout)s::double precision, 'on_timeout', %(on_timeout)s::text)), {_ERRORS_KEPT}),
        updated_at = now()
    WHERE {_HOLDS_RECEIPT} AND {(S.CLAIMED | S.PENDING).sql("t")}
    RETURNING {_RETURNING_T}
),
unlinked AS (
    DELETE FROM todos_dependency e USING changed WHERE e.dependent_id = changed.id AND e.wait AND %(unlink)s
),
opened AS (
    INSERT INTO todos_waitpoint (todo_id, queue, created_at, timeout_at, on_timeout, token_hash, event_source,
        event_type_like, event_match, event_key, resolved_at, waiter, resolver_agents, resolver_scopes,
        people, decider_users, decider_groups, escalate_groups, remind_at, escalate_at, reminded_at,
        escalated_at, decided_by)
    SELECT id, queue, now(), now() + make_interval(secs => %(timeout)s), %(on_timeout)s, %(hash)s,
        %(source)s, %(type_like)s, %(match)s, %(key)s, NULL, %(agent)s, %(resolver_agents)s::text[],
        %(resolver_scopes)s::text[], %(people)s, %(decider_users)s::int[], %(decider_groups)s::int[],
        %(escalate_groups)s::int[], now() + make_interval(secs => %(remind_after)s::double precision),
        now() + make_interval(secs => %(escalate_after)s::double precision), NULL, NULL, NULL
    FROM changed
    ON CONFLICT (todo_id) DO UPDATE SET queue = EXCLUDED.queue, created_at = EXCLUDED.created_at,
        timeout_at = EXCLUDED.timeout_at, on_timeout = EXCLUDED.on_timeout, token_hash = EXCLUDED.token_hash,
        event_source = EXCLUDED.event_source, event_type_like = EXCLUDED.event_type_like,
        event_match = EXCLUDED.event_match, event_key = EXCLUDED.event_key, resolved_at = NULL,
        waiter = EXCLUDED.waiter, resolver_agents = EXCLUDED.resolver_agents,
        resolver_scopes = EXCLUDED.resolver_scopes, people = EXCLUDED.people,
        decider_users = EXCLUDED.decider_users, decider_groups = EXCLUDED.decider_groups,
        escalate_groups = EXCLUDED.escalate_groups, remind_at = EXCLUDED.remind_at,
        escalate_at = EXCLUDED.escalate_at, reminded_at = NULL, escalated_at = NULL, decided_by = NULL
)
SELECT * FROM changed
"""

# link_wait (queue.wait on todos, before WAIT in the same transaction): the edges of the wait, as LINK makes
# a create's, marked wait. Guard: each awaited todo is visible to the waiter (the ids that do not come back
# are refused: 404, and the transaction rolls back). Lock: each awaited row FOR NO KEY UPDATE, in id order,
# held to commit: a statement finishing one either finished it before (it comes back with its outcome, and
# SETTLE counts it off once WAIT has made the waiter wait) or waits, then sees the flag and the committed
# edge (todos_settle_dependents). Then the waiter's edges of an earlier wait go, and only then (the
# counts order the CTEs): a statement finishing an awaited todo holds that row and then deletes its edges,
# so deleting first and locking second could deadlock with it. Index: the primary keys, and
# dependency_waiter for the waiter's old edges.
LINK_WAIT = f"""
WITH awaited AS (
    SELECT * FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS a(id, n)
),
locked AS MATERIALIZED (
    SELECT t.id, t.has_dependents, {_OUTCOME} AS outcome FROM todos_todo t
    WHERE t.id IN (SELECT id FROM awaited) AND t.queue LIKE ANY(%(visible)s::text[])
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
),
unlinked AS MATERIALIZED (
    DELETE FROM todos_dependency e
    WHERE e.dependent_id = %(id)s AND e.wait AND (SELECT count(*) FROM locked) >= 0
    RETURNING e.dependency_id
),
flagged AS (
    UPDATE todos_todo t SET has_dependents = true FROM locked WHERE t.id = locked.id AND NOT locked.has_dependents
),
linked AS (
    INSERT INTO todos_dependency (dependency_id, dependent_id, position, wait)
    SELECT a.id, %(id)s, a.n - 1, true FROM awaited a
    WHERE a.id IN (SELECT id FROM locked) AND (SELECT count(*) FROM unlinked) >= 0
)
SELECT id, outcome FROM locked
"""


def _resolving(hit: str, by: str, detail: str, guard: str = "true") -> str:
    """Close waitpoints (``hit``: an UPDATE of todos_waitpoint RETURNING todo_id, resolved_at) and move
    their todos, still waiting, to pending; notifies their queues; returns the todos."""
    return f"""
WITH hit AS ({hit}),
changed AS (
    UPDATE todos_todo t SET {_resolved_set(by, detail)}
    FROM hit
    WHERE t.id = hit.todo_id AND hit.resolved_at IS NOT NULL AND {S.WAITING.sql("t")} AND {guard}
    RETURNING {_RETURNING_T}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM changed WHERE {S.PENDING.sql()} GROUP BY queue) q
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""


# resolve_token: the waitpoint whose token hashes to %(hash)s (unique index). No other credential:
# the token is the credential. Resolves once; a second finds it closed.
RESOLVE_TOKEN = _resolving(
    """
    UPDATE todos_waitpoint w SET resolved_at = now()
    WHERE w.token_hash = %(hash)s AND w.resolved_at IS NULL
    RETURNING w.todo_id, w.resolved_at""",
    "'token'",
    "jsonb_build_object('data', %(data)s::jsonb)",
)

# One agent's event waits, one at a time (in the transaction of queue.wait's event branch): its count of
# OPEN_EVENT_WAITS and its WAIT are then one step. Transaction-scoped, so it holds under PgBouncer's
# transaction mode, and is released at commit or rollback.
AGENT_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))"

# The open event waits of one agent whose todos still wait (a cancelled todo's wait stays open until its
# timeout sweeps it, and is not counted): MAX_OPEN_EVENT_WAITS_PER_AGENT. Index: waitpoint_open_event_waiter,
# then each todo's primary key; at most the cap plus one rows are read.
OPEN_EVENT_WAITS = f"""
SELECT count(*) FROM (
    SELECT 1 FROM todos_waitpoint w JOIN todos_todo t ON t.id = w.todo_id AND {S.WAITING.sql("t")}
    WHERE w.waiter = %(agent)s AND w.event_key IS NOT NULL AND w.resolved_at IS NULL
    LIMIT %(cap)s
) open_waits
"""

# A token's waitpoint, open or closed (telling a second resolve, 409, from an unknown token, 404).
WAITPOINT_BY_HASH = "SELECT todo_id, resolved_at FROM todos_waitpoint WHERE token_hash = %(hash)s"

# resolve (issue 28: who may resolve is part of the wait): the open wait of this todo, within the caller's
# scopes, when the caller is an operator (%(operator)s: an admin action, or a staff agent with change_todo)
# or an agent the wait names (its name in resolver_agents, or one of its claim scopes, as written, LIKE a
# pattern of resolver_scopes); never the agent that waits (%(agent)s NULL: an admin action, no agent), and
# no agent at all for a wait for people (issue 29: a person decides, todos/sql/people.py). A
# refused caller closes nothing. Lock: the waitpoint row (the race's decider, as for every resolver).
# Index: the waitpoint's primary key. %(by)s names the kind of resolver; %(detail)s the data and who.
RESOLVE_MANUAL = _resolving(
    """
    UPDATE todos_waitpoint w SET resolved_at = now()
    WHERE w.todo_id = %(id)s AND w.resolved_at IS NULL AND w.queue LIKE ANY(%(visible)s::text[])
      AND (%(agent)s::text IS NULL OR w.waiter IS DISTINCT FROM %(agent)s::text)
      AND (%(agent)s::text IS NULL OR w.people IS NULL)
      AND (%(operator)s::boolean OR %(agent)s::text = ANY(w.resolver_agents) OR EXISTS (
          SELECT 1 FROM unnest(w.resolver_scopes) AS p(pattern), unnest(%(claim_scopes)s::text[]) AS s(scope)
          WHERE s.scope LIKE p.pattern))
    RETURNING w.todo_id, w.resolved_at""",
    "%(by)s::text",
    "%(detail)s::jsonb",
)

# resolve_events (in the ingest transaction that stores the event): the open waits indexed under one of
# the delivery's keys (waitpoint_event_key, one probe per key), of its source, begun before it arrived,
# whose type glob and whole match hold. The event's id and payload go into each resolution.
RESOLVE_EVENTS = _resolving(
    """
    UPDATE todos_waitpoint w SET resolved_at = now()
    WHERE w.event_key = ANY(%(keys)s::text[]) AND w.resolved_at IS NULL AND w.event_source = %(source)s
      AND %(type)s::text LIKE w.event_type_like AND %(payload)s::jsonb @> w.event_match
      AND w.created_at <= %(received_at)s::timestamptz
    RETURNING w.todo_id, w.resolved_at""",
    "'event'",
    """jsonb_build_object('event', jsonb_build_object('id', %(event_id)s::text, 'source', %(source)s::text,
        'type', %(type)s::text, 'payload', %(payload)s::jsonb))""",
)

# time_out_waits (reaper): a batch of open waits past their timeout, oldest first, SKIP LOCKED (shared with
# other reapers; a resolver holding one wins, and this one skips it). on_timeout pending: runnable again,
# resolution timed_out. fail: a failure that counts toward the attempts (the wait gave its attempt back),
# with FAIL's backoff below the cap and a dead-letter at it, which finishes the todo for its own waiters.
TIME_OUT_WAITS = _finishing(
    f"""
    UPDATE todos_todo t SET
        state = CASE WHEN closed.on_timeout = 'fail' THEN '{S.TodoState.FAILED}' ELSE '{S.TodoState.PENDING}' END,
        attempt = CASE WHEN closed.on_timeout = 'fail' THEN t.attempt + 1 ELSE t.attempt END,
        next_retry_at = CASE WHEN closed.on_timeout = 'fail' AND t.attempt + 1 < t.max_attempts
            THEN now() + make_interval(secs => random() * LEAST(%(backoff_cap)s::double precision,
                %(backoff_base)s::double precision * power(2, t.attempt)))
            END,
        waiting_for = NULL,
        dependencies_left = 0,
        resolution = jsonb_build_object('by', 'timeout', 'at', now(), 'timed_out', true),
        errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
            'attempt', t.attempt + CASE WHEN closed.on_timeout = 'fail' THEN 1 ELSE 0 END, 'at', now(),
            'error', 'wait timed out', 'on_timeout', closed.on_timeout)), {_ERRORS_KEPT}),
        updated_at = now()
    FROM closed
    WHERE t.id = closed.todo_id AND {S.WAITING.sql("t")}
    RETURNING t.id, t.queue, t.state, t.next_retry_at, t.has_dependents""",
    notify_when=S.PENDING.sql(),
    before="""due AS MATERIALIZED (
    SELECT todo_id FROM todos_waitpoint
    WHERE resolved_at IS NULL AND timeout_at <= now()
    ORDER BY timeout_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
closed AS (
    UPDATE todos_waitpoint w SET resolved_at = now() FROM due WHERE w.todo_id = due.todo_id
    RETURNING w.todo_id, w.on_timeout
),
""",
)
