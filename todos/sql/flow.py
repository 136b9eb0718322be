"""Named limits (issue 31): the claim's predicates over the limit rows, each one named fragment that every claim
statement (todos/sql/claim.py) and a read that explains a todo's wait (issue 30's explain) use alike.

A limit (todos_limit, todos/models.py Limit) is shared by every queue and todo naming it. A claim takes a todo
only when every limit it is held by (HELD_BY: its own and its queue's) allows one more: not parked, live leases
below max_claimed, a token in its bucket, and its fair_key's live leases below per_key times the key's weight.
The limit rows are locked FOR NO KEY UPDATE in name order (one order for every claimer: no deadlock), after the
queue rows (claim.py's ``limited``), and waited for, as a limited queue's row is: a claim that skipped a limit
row would answer empty while the holder leaves room. The counts are read with a fresh snapshot after the lock
(todos_limit_live_leases), as a queue's max_claimed is; the bucket is written back in the same statement.

A todo that names no limit, on a queue that names none, pays nothing: the plain claim (CLAIM_NEXT) reads the
candidates' limits column, which it fetches anyway, and hands over to CLAIM_NEXT_FAIR only when one names a
limit (docs/query-plans.md).
"""

from todos import states as S
from todos.sql.common import _ERRORS_KEPT, _HOLDS_RECEIPT, _TODO_COLUMNS, NOTIFY_CHANNEL
from todos.sql.create import _RUNNABLE_KEY
from todos.sql.operators import CANCEL

_NO_LIMITS = "'{}'::text[]"


def not_expired(todo: str) -> str:
    """NOT_EXPIRED: the todo's start-by deadline (expires_at) has not passed, or it has none, or it was claimed
    before (it has started). Every claim branch of a todo not yet claimed carries it: the claim never takes a
    todo late (the reaper's EXPIRE cancels it)."""
    return f"({todo}.expires_at IS NULL OR {todo}.expires_at > now() OR {todo}.claimed_at IS NOT NULL)"


def held_by(todo_limits: str, queue_limits: str) -> str:
    """HELD_BY: the limits a todo is held by, its own (``todo_limits``) and its queue's (``queue_limits``);
    '{}' for neither."""
    return f"(COALESCE({todo_limits}, {_NO_LIMITS}) || COALESCE({queue_limits}, {_NO_LIMITS}))"


def parked(limit: str) -> str:
    """PARKED: the limit lets nothing through until its parked_until (a quota wall); it resumes on its own."""
    return f"({limit}.parked_until IS NOT NULL AND {limit}.parked_until > now())"


def tokens(limit: str) -> str:
    """The limit's bucket now: refilled by the time elapsed times the rate, capped at the burst; NULL without
    a rate."""
    return f"""CASE WHEN {limit}.rate_per_second IS NOT NULL THEN LEAST({limit}.rate_burst::double precision,
        {limit}.tokens + GREATEST(EXTRACT(EPOCH FROM now() - {limit}.refilled_at)::double precision, 0)
        * {limit}.rate_per_second) END"""


def quota(limit: str, tokens_now: str) -> str:
    """LIMIT_QUOTA: how many more claims the limit allows now (0 while parked); NULL: no bound."""
    return f"""CASE WHEN {parked(limit)} THEN 0
        WHEN {limit}.max_claimed IS NULL AND {tokens_now} IS NULL THEN NULL
        ELSE GREATEST(LEAST({limit}.max_claimed - todos_limit_live_leases({limit}.name, NULL),
                            floor({tokens_now})::integer), 0) END"""


def key_room(limit: str, weights: str, key: str) -> str:
    """KEY_ROOM: how many more of one fair_key's todos a limit with per_key allows (per_key times the key's
    weight on its queue, ``weights``: the queue's fair_weights, default 1; at least 1); NULL: no bound."""
    return f"""CASE WHEN {limit}.per_key IS NOT NULL THEN
        GREATEST(floor({limit}.per_key * COALESCE(({weights} ->> {key})::double precision, 1)), 1)::integer
        - todos_limit_live_leases({limit}.name, {key}) END"""


# BLOCKED: the first parked limit a todo is held by, as {limit, until, reason}, or NULL: what its JSON, the
# admin and explain show while it waits on a quota wall. ``{held}``: HELD_BY of the todo.
def blocked(held: str) -> str:
    return f"""(SELECT jsonb_build_object('limit', l.name, 'until', l.parked_until, 'reason', l.park_reason)
        FROM todos_limit l WHERE l.name = ANY({held}) AND {parked("l")} ORDER BY l.name LIMIT 1)"""


def claim_ctes(pool: str) -> str:
    """The CTEs that decide which of a claim's candidates its limits let through. ``pool``: a CTE of
    (id, queue, priority, run_at, fair_key, lims, weights) rows, the candidates that are held by a limit
    (lims: HELD_BY, never empty; weights: their queue's fair_weights). ``flow_blocked`` lists the ids the
    limits refuse: a candidate goes through only if, for every limit it names, its place among the pool's
    candidates naming that limit (claim order) is within the limit's quota, and its place among those of its
    fair_key within the key's room. Never more than a limit allows; a batch whose candidates name several
    limits may take fewer than the limits would allow (a candidate refused by one limit still holds its place
    under the others)."""
    return f"""flow_limits AS MATERIALIZED (
    SELECT l.name, l.max_claimed, l.per_key, l.parked_until, l.rate_per_second, l.rate_burst,
        {tokens("l")} AS tokens
    FROM todos_limit l
    WHERE l.name IN (SELECT DISTINCT unnest(p.lims) FROM {pool} p)
    ORDER BY l.name
    FOR NO KEY UPDATE OF l
),
flow_quotas AS MATERIALIZED (
    SELECT f.name, f.per_key, {quota("f", "f.tokens")} AS quota FROM flow_limits f
),
flow_blocked AS MATERIALIZED (
    SELECT DISTINCT r.id FROM (
        SELECT c.id, c.fair_key, c.weights, x.name,
            row_number() OVER (PARTITION BY x.name ORDER BY c.priority, c.run_at, c.id) AS nth,
            row_number() OVER (PARTITION BY x.name, c.fair_key ORDER BY c.priority, c.run_at, c.id) AS nth_key
        FROM {pool} c CROSS JOIN unnest(c.lims) AS x(name)
    ) r JOIN flow_quotas f ON f.name = r.name
    WHERE r.nth > f.quota OR r.nth_key > {key_room("f", "r.weights", "r.fair_key")}
),"""


def bucket(pool: str, taken: str) -> str:
    """The limits' buckets written back for what the claim took (``taken``: a query of the claimed ids), under
    the limit rows' lock, in the same statement."""
    return f"""flow_bucket AS (
    UPDATE todos_limit l SET tokens = f.tokens - n.n, refilled_at = GREATEST(l.refilled_at, now())
    FROM flow_limits f JOIN (
        SELECT x.name, count(*) AS n FROM {pool} p CROSS JOIN unnest(p.lims) AS x(name)
        WHERE p.id IN ({taken}) GROUP BY x.name
    ) n ON n.name = f.name
    WHERE l.name = f.name AND f.tokens IS NOT NULL
)"""


# The limit rows (todos/flow.py). A limit's JSON columns, in NamedLimit's order.
_LIMIT_COLUMNS = """name, max_claimed, rate_per_second, rate_burst, per_key, parked_until, park_reason, created_at,
    updated_at"""

GET_LIMIT = f"SELECT {_LIMIT_COLUMNS} FROM todos_limit WHERE name = %(name)s"

# PUT: define or replace a limit's settings (a park stays); the bucket starts full. Answers the row and whether
# it was created (xmax = 0: the row was inserted, not updated).
PUT_LIMIT = f"""
INSERT INTO todos_limit AS l (name, created_at, updated_at, max_claimed, rate_per_second, rate_burst, tokens,
    refilled_at, per_key, park_reason)
VALUES (%(name)s, now(), now(), %(max_claimed)s::integer, %(rate_per_second)s::double precision,
    %(rate_burst)s::integer, %(rate_burst)s::double precision,
    CASE WHEN %(rate_per_second)s::double precision IS NOT NULL THEN now() END, %(per_key)s::integer, '')
ON CONFLICT (name) DO UPDATE SET updated_at = now(), max_claimed = EXCLUDED.max_claimed,
    rate_per_second = EXCLUDED.rate_per_second, rate_burst = EXCLUDED.rate_burst, tokens = EXCLUDED.tokens,
    refilled_at = EXCLUDED.refilled_at, per_key = EXCLUDED.per_key
RETURNING {_LIMIT_COLUMNS}, (xmax = 0) AS created
"""

DELETE_LIMIT = f"DELETE FROM todos_limit WHERE name = %(name)s RETURNING {_LIMIT_COLUMNS}"


# park (a fail or a release with ``park``): the holder hit a quota wall. In one statement: the todo goes back to
# pending with its attempt given back (as a release: parking spends no attempt), its errors record the park
# (and the holder's error text, if any), and the limit is parked until %(until)s (the later of that and a park
# still running: two holders hitting one wall keep the later reset), created if no PUT defined it yet. Guard:
# the current receipt, and the todo is held by the limit (HELD_BY: its own limits or its queue's), so a holder
# parks only a limit its todo names. Lock: the todo's row, then the limit's (a claim locks limit rows but never
# waits for a todo's row: no cycle). Notifies the todo's queue, as a release does.
PARK = f"""
WITH released AS (
    UPDATE todos_todo t SET
        state = 'pending',
        attempt = GREATEST(t.attempt - 1, 0),
        lease_id = NULL,
        lease_expires_at = NULL,
        next_retry_at = NULL,
        updated_at = now(),
        errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
            'attempt', t.attempt, 'at', now(), 'error', %(error)s::text,
            'parked', jsonb_build_object('limit', %(limit)s::text, 'until', %(until)s::timestamptz,
                                         'reason', %(reason)s::text))), {_ERRORS_KEPT})
    WHERE {_HOLDS_RECEIPT} AND {S.CLAIMED.sql("t")}
      AND %(limit)s::text = ANY({held_by("t.limits", "(SELECT q.limits FROM todos_queue q WHERE q.name = t.queue)")})
    RETURNING {", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))}
),
parked AS (
    INSERT INTO todos_limit AS l (name, created_at, updated_at, parked_until, park_reason)
    SELECT %(limit)s, now(), now(), %(until)s, %(reason)s FROM released
    ON CONFLICT (name) DO UPDATE SET updated_at = now(),
        parked_until = GREATEST(l.parked_until, EXCLUDED.parked_until),
        park_reason = CASE WHEN l.parked_until > EXCLUDED.parked_until THEN l.park_reason ELSE EXCLUDED.park_reason END
),
notified AS MATERIALIZED (SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM released)
SELECT released.* FROM released CROSS JOIN (SELECT count(*) FROM notified) n
"""

# The limits a holder's todo is held by (HELD_BY), read before PARK to tell a limit it does not name (a 400)
# from a receipt that is not current (PARK's guard: 404 / 409).
HELD_LIMITS = f"""
SELECT {held_by("t.limits", "q.limits")} FROM todos_todo t LEFT JOIN todos_queue q ON q.name = t.queue
WHERE t.id = %(id)s AND t.queue LIKE ANY(%(visible)s::text[])
"""

# unpark: an operator lifts a park; notifies nothing itself (the long-polls of held queues re-poll, see
# SECONDS_UNTIL_CLAIMABLE).
UNPARK = f"""
UPDATE todos_limit SET parked_until = NULL, park_reason = '', updated_at = now() WHERE name = %(name)s
RETURNING {_LIMIT_COLUMNS}
"""

# BLOCKED for a page of todos (their JSON's ``blocked``): only pending and scheduled todos can be blocked.
BLOCKED_OF = f"""
SELECT t.id, {blocked(held_by("t.limits", "q.limits"))}
FROM todos_todo t LEFT JOIN todos_queue q ON q.name = t.queue
WHERE t.id = ANY(%(ids)s::text[]) AND t.state IN ('pending', 'scheduled')
  AND (t.limits IS NOT NULL OR q.limits IS NOT NULL)
"""


# supersede (a create with ``supersede``, issue 31): CANCEL, with reason 'superseded', of the runnable todo
# holding (queue, idempotency_key): pending, scheduled, waiting, retry-waiting, or claimed (its lease is
# revoked: the holder's next step is 409 superseded). Run in the create's transaction, before its INSERT, so
# the key is free for the new todo when it commits. Guard: the runnable key (the unique index's predicate) and
# the caller's scopes; lock: that row (a claim holding it first is waited for, then its claimed row cancelled).
SUPERSEDE = CANCEL.replace(
    "t.id = ANY(%(ids)s::text[]) AND",
    f"t.queue = %(queue)s AND t.idempotency_key = %(key)s AND {_RUNNABLE_KEY} AND",
)

# debounce (a create with ``debounce_seconds``, issue 31): the pending or scheduled todo holding the key runs
# at now() + N instead (scheduled), so a burst of creates makes one todo that runs N seconds after the last.
# Guard: the key's runnable holder is pending or scheduled (a claimed one is being worked on: left alone);
# lock: its row.
DEBOUNCE = f"""
UPDATE todos_todo t SET state = 'scheduled', run_at = now() + make_interval(secs => %(seconds)s), updated_at = now()
WHERE t.queue = %(queue)s AND t.idempotency_key = %(key)s AND {(S.PENDING | S.SCHEDULED).sql("t")}
  AND t.queue LIKE ANY(%(visible)s::text[])
RETURNING {", ".join("t." + c.strip() for c in _TODO_COLUMNS.split(","))}
"""


# expire (the reaper, issue 31): CANCEL, with reason 'expired', of up to %(batch)s todos past their start-by
# deadline that were never claimed (pending, scheduled, waiting or retry-waiting), oldest deadline first. Guard:
# NOT_EXPIRED fails (re-checked on the latest row: a claim that took it first set claimed_at, and the claim's
# own NOT_EXPIRED keeps it from taking one this has cancelled: exactly one wins); lock: SKIP LOCKED, so a row a
# claimer holds is left to the next sweep; index: todo_expiry (partial: never-claimed todos with a deadline).
EXPIRE = CANCEL.replace(
    "t.id = ANY(%(ids)s::text[]) AND",
    f"""t.id IN (
        SELECT e.id FROM todos_todo e
        WHERE e.expires_at <= now() AND e.claimed_at IS NULL AND e.expires_at IS NOT NULL
        ORDER BY e.expires_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    ) AND NOT {not_expired("t")} AND""",
)
