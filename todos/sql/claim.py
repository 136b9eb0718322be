"""Claims (claim_next, claim) and the queue controls' CTEs every claim starts with."""

from todos import states as S
from todos.sql import flow
from todos.sql.common import _ERRORS_KEPT, _RETURNING_T
from todos.sql.trees import BUDGET_OPEN

# Scheduling (issue 12): its conditions (S.SCHEDULED_DUE, the claim order, ...) are in todos/states.py.
# Claim order, everywhere a claim chooses: priority first (lower first), then time (run_at).
CLAIM_ORDER = S.claim_order_sql()


# What a claim may take: pending, a lapsed lease below its cap (SPEC decision 1; one at its cap is
# never handed out again, the reaper dead-letters it), a failed todo whose retry is due, or a scheduled
# todo whose run_at has come. The assignee, if any, must be the claimer, and a todo never claimed must not be
# past its start-by deadline (NOT_EXPIRED, issue 31).
_CLAIMABLE = f"""(t.assignee IS NULL OR t.assignee = %(agent)s) AND {S.CLAIMABLE.sql("t")}
    AND {flow.not_expired("t")}"""

_CLAIM_SET = f"""
    state = 'claimed',
    attempt = t.attempt + 1,
    owner = %(owner)s,
    lease_id = 'ls_' || replace(gen_random_uuid()::text, '-', ''),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    claimed_at = now(),
    updated_at = now(),
    next_retry_at = NULL,
    -- re-claiming a lapsed lease before the reaper saw it records the lapse, as the reaper would, and
    -- when this claim took it over (reclaimed_at = this claim's claimed_at: the metrics count these)
    errors = CASE WHEN {S.CLAIMED.sql("t")} THEN jsonb_path_query_array(t.errors || jsonb_build_array(
            jsonb_build_object('attempt', t.attempt, 'at', t.lease_expires_at, 'error', 'lease expired',
                'reclaimed_at', now())), {_ERRORS_KEPT})
        ELSE t.errors END"""


# Queue controls (issue 11), the CTEs every claim starts with. ``eligible`` is a condition on todos_queue q:
# the queues this claim may take from. Each comes out of ``quotas`` with how many todos this claim may
# take from it (%(limit)s for an unlimited queue; a paused queue is not there at all).
#  * Since issue 32 only CLAIM_NEXT_FAIR and CLAIM_ONE claim from a limited queue; the plain CLAIM_NEXT's
#    ``quotas`` is empty when a limited, keyed or flow queue is among the caller's (it answers the row of
#    NULLs). What follows about ``limited`` is theirs.
#  * Plain queues (no limit, not keyed) are read as in wave 1: no lock, no count, no write. ``limited`` is
#    then empty, and every branch below that only a controlled queue needs hangs off it: PostgreSQL runs
#    none of them (issue 19: a plain queue's claim back at wave 1's cost).
#  * A limited queue's row is locked FOR NO KEY UPDATE (the claim changes no key: a create's FOR KEY SHARE of
#    the row, migration 0023, never waits for it), and a concurrent claimer of it WAITS (no SKIP LOCKED):
#    skipping would hand it an empty list while the holder may leave slots or tokens over, and a
#    long-poll refused that way would sleep with work claimable. The wait is one claim statement long;
#    claimers of a limited queue take turns, which is what a limit means. Rows are locked in name order,
#    so claimers of several limited queues cannot deadlock.
#  * After the wait the row is the latest version (READ COMMITTED re-reads a locked row), but this
#    statement's snapshot is older than the claims that committed meanwhile: the live leases are counted
#    by todos_live_leases() (migration 0014), a VOLATILE function whose query takes a fresh snapshot.
#  * The token bucket refills by the time elapsed times the rate, capped at the burst; the claim takes at
#    most floor(tokens), and ``queue_writeback`` writes back what it took, in the same statement, under the
#    lock. A claim that takes nothing writes nothing: refilling later from the old refilled_at gives the same.
#    GREATEST: a claimer whose transaction started before the last writer's never refills backwards.
#  * A keyed queue (fair, or with max_claimed_per_key: issue 22) is locked the same way by CLAIM_NEXT_FAIR and
#    CLAIM_ONE (issue 31, _SERIALIZED below): its claimers take turns, one claim statement each, and lock keys
#    only under it. Only CLAIM_NEXT_FAIR and CLAIM_ONE read the fair settings (``fair``); the plain CLAIM_NEXT
#    reads what it read before fair share, plus ``keyed``.
_KEYED = "(q.fair OR q.max_claimed_per_key IS NOT NULL)"
# The plain claim (CLAIM_NEXT) takes nothing, and locks no queue row, when a keyed queue is among the
# caller's: a one-time filter over ``queues``, which it reads anyway.
_NO_KEYED = "NOT EXISTS (SELECT FROM queues k WHERE k.keyed OR k.flow OR k.limited)"
# CLAIM_NEXT_LIMITED's (issue 32): it claims from limited queues, and hands keyed and flow ones over.
_NO_KEYED_OR_FLOW = "NOT EXISTS (SELECT FROM queues k WHERE k.keyed OR k.flow)"
# A queue that names limits (issue 31): its claims are CLAIM_NEXT_FAIR's, as a keyed queue's.
_FLOW = "(q.limits IS NOT NULL)"
# The queues whose claims take turns on the queue's row (issue 31): limited ones (their count and bucket) and
# keyed ones (fair share and max_claimed_per_key). Keyed claimers once locked only the keys they took, SKIP
# LOCKED, so while one held the heavy key the others skipped to the light ones: weights 3:1 came out 1.79:1
# at 4 claimers. Holding the queue's row for one claim statement, each fair claim sees the passes its
# predecessor wrote (the walk reads them with a fresh snapshot) and takes the lowest tags of all the keys: the
# weights are exact by construction at any number of claimers, and a batch fills from one key.
_SERIALIZED = "(queues.limited OR queues.keyed)"


# Reservations (issue 31): a queue whose fair turns may reserve, and whose reserved todos CLAIM_FAIR_READY may
# hand out, is one where a reservation cannot break a control: fair, no max_claimed or rate (its count and bucket
# are the turn's), no max_claimed_per_key or rate_per_key (a key's count and bucket), no named limits.
def reservable(q: str) -> str:
    return f"""({q}.fair AND {q}.max_claimed IS NULL AND {q}.rate_per_second IS NULL AND {q}.max_claimed_per_key IS NULL
        AND {q}.rate_per_key IS NULL AND {q}.limits IS NULL)"""


_RESERVE = "(SELECT %(reserve)s::integer)"


def _plain_queues(eligible: str) -> str:
    """The caller's unpaused queues, each with what decides which claim statement serves it: ``limited``
    (CLAIM_NEXT_LIMITED), ``keyed`` or ``flow`` (CLAIM_NEXT_FAIR), or none of them (CLAIM_NEXT)."""
    return f"""queues AS MATERIALIZED (
    SELECT q.name, (q.max_claimed IS NOT NULL OR q.rate_per_second IS NOT NULL) AS limited, {_KEYED} AS keyed,
        {_FLOW} AS flow
    FROM todos_queue q
    WHERE {eligible} AND NOT q.paused
)"""


def _queue_quotas(eligible: str, *, fair: bool = False, limited: bool = False, reserve: bool = False) -> str:
    """The queue controls' CTEs: for CLAIM_NEXT_FAIR and CLAIM_ONE (``fair``) every eligible queue, keyed
    ones with their fair settings; for the plain CLAIM_NEXT, what a claim read before fair share, and nothing
    at all when a keyed queue is eligible (``keyed`` then tells the caller to run CLAIM_NEXT_FAIR). ``reserve``
    (CLAIM_NEXT_FAIR): a turn that had to wait for its queue's row reserves (``reserving``, see CLAIM_NEXT_FAIR)."""
    if limited:
        return f"""{_plain_queues(eligible)},
limited AS MATERIALIZED (
    SELECT q.name, q.max_claimed,
        CASE WHEN q.rate_per_second IS NOT NULL THEN LEAST(q.rate_burst::double precision, q.tokens
            + GREATEST(EXTRACT(EPOCH FROM now() - q.refilled_at)::double precision, 0) * q.rate_per_second) END
            AS tokens
    FROM queues JOIN todos_queue q ON q.name = queues.name
    WHERE queues.limited AND NOT q.paused  -- re-checked on the latest row: a pause that committed meanwhile
      AND NOT {_KEYED} AND NOT {_FLOW}  -- and fair share or limits set meanwhile: CLAIM_NEXT_FAIR's to keep
      AND {_NO_KEYED_OR_FLOW}
    ORDER BY q.name
    FOR NO KEY UPDATE OF q
),
quotas AS MATERIALIZED (
    SELECT name, %(limit)s::integer AS quota FROM queues WHERE NOT limited AND {_NO_KEYED_OR_FLOW}
    UNION ALL
    -- LEAST ignores NULLs: a control that is not set does not limit.
    SELECT name, GREATEST(LEAST(%(limit)s::integer,
        CASE WHEN max_claimed IS NOT NULL THEN max_claimed - todos_live_leases(name) END,
        floor(tokens)::integer), 0)
    FROM limited
)"""
    if not fair:
        # Plain queues only (issue 32): a limited queue's claims are CLAIM_NEXT_FAIR's too, so this statement
        # carries no lock, count, bucket or per-queue quota for controls a plain queue does not use.
        return f"""{_plain_queues(eligible)},
quotas AS MATERIALIZED (
    SELECT name, %(limit)s::integer AS quota FROM queues WHERE {_NO_KEYED}
)"""
    # The contention probe (issue 31, reservations): when exactly one serialized queue is eligible, and it may
    # reserve, first try its row FOR NO KEY UPDATE SKIP LOCKED. Got it: nobody held it, the turn is uncontended
    # and reserves nothing (one claimer: exact order as before). Got nothing: another claimer holds the turn,
    # ``limited`` below waits for it as before, and this turn reserves. Deterministic, no timing. With several
    # serialized queues there is no probe and no reservation: a SKIP LOCKED pass would take rows out of name
    # order, and two claimers could deadlock. ``reserving`` is read in ``limited``'s target list, which is
    # computed before its LockRows waits (so the probe has run) and again on the latest row after the wait
    # (so the reservable settings are the locked row's, not this statement's older snapshot).
    one_queue = f"(SELECT count(*) FROM queues WHERE {_SERIALIZED}) = 1 AND {_RESERVE} > 0"
    first_try = (
        f"""
first_try AS MATERIALIZED (
    SELECT q.name FROM todos_queue q
    WHERE q.name IN (SELECT name FROM queues WHERE {_SERIALIZED} AND reservable) AND {one_queue}
    FOR NO KEY UPDATE OF q SKIP LOCKED
),"""
        if reserve
        else ""
    )
    reserving = (
        f"""(queues.reservable AND {reservable("q")} AND {one_queue}
            AND NOT EXISTS (SELECT FROM first_try))"""
        if reserve
        else "false"
    )
    plus_reserve = f" + CASE WHEN reserving THEN {_RESERVE} ELSE 0 END" if reserve else ""
    return f"""queues AS MATERIALIZED (
    SELECT q.name, (q.max_claimed IS NOT NULL OR q.rate_per_second IS NOT NULL) AS limited, {_KEYED} AS keyed,
        q.fair_weights, q.max_claimed_per_key AS key_cap, q.fair_round, {_FLOW} AS flow, q.limits AS qlimits,
        q.rate_per_key AS key_rate, {reservable("q")} AS reservable
    FROM todos_queue q
    WHERE {eligible} AND NOT q.paused
),{first_try}
limited AS MATERIALIZED (
    SELECT q.name, q.max_claimed,
        CASE WHEN q.rate_per_second IS NOT NULL THEN LEAST(q.rate_burst::double precision, q.tokens
            + GREATEST(EXTRACT(EPOCH FROM now() - q.refilled_at)::double precision, 0) * q.rate_per_second) END
            AS tokens,
        queues.keyed, q.fair_round, {reserving} AS reserving
    FROM queues JOIN todos_queue q ON q.name = queues.name
    WHERE {_SERIALIZED} AND NOT q.paused  -- re-checked on the latest row: a pause that committed meanwhile
    ORDER BY q.name
    FOR NO KEY UPDATE OF q
),
quotas AS MATERIALIZED (
    SELECT name, %(limit)s::integer AS quota, keyed, fair_round, false AS reserving FROM queues
    WHERE NOT {_SERIALIZED}
    UNION ALL
    -- LEAST ignores NULLs: a control that is not set does not limit. A reserving turn's quota is the claim's
    -- limit plus what it reserves (a reserving queue has none of the controls).
    SELECT name, GREATEST(LEAST(%(limit)s::integer{plus_reserve},
        CASE WHEN max_claimed IS NOT NULL THEN max_claimed - todos_live_leases(name) END,
        floor(tokens)::integer), 0), keyed, fair_round, reserving
    FROM limited
)"""


# The token bucket's write-back, under the queue's lock: ``taken`` is a query of (queue, n) for what this
# statement claimed.
def _bucket(taken: str) -> str:
    return f"""
bucket AS (
    UPDATE todos_queue q SET tokens = l.tokens - taken.n, refilled_at = GREATEST(q.refilled_at, now())
    FROM limited l JOIN ({taken}) taken ON taken.queue = l.name
    WHERE q.name = l.name AND l.tokens IS NOT NULL
)"""


# The time-ordered branches of a claim (due scheduled todos, lapsed leases, due retries), each returning
# ``columns`` of its rows: the plain claim's, and the fair claim's with fair_key.
def _time_branches(columns: str) -> str:
    def cols(alias: str) -> str:
        return ", ".join(f"{alias}.{c}" for c in columns.split(", "))

    return f"""scheduled AS MATERIALIZED (
    SELECT {cols("s")} FROM (SELECT name, quota FROM quotas WHERE quota > 0) quotas
    CROSS JOIN LATERAL (
        SELECT {cols("t")} FROM todos_todo t
        WHERE {S.SCHEDULED_DUE.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s) AND {flow.not_expired("t")}
        ORDER BY t.run_at
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) s
),
lapsed AS MATERIALIZED (
    SELECT {cols("t")} FROM todos_todo t
    WHERE {S.RECLAIMABLE.sql("t")}
      AND t.queue IN (SELECT name FROM quotas WHERE quota > 0) AND (t.assignee IS NULL OR t.assignee = %(agent)s)
    ORDER BY t.lease_expires_at
    LIMIT {_LIMIT}
    FOR UPDATE SKIP LOCKED
),
due AS MATERIALIZED (
    SELECT {cols("d")} FROM (SELECT name, quota FROM quotas WHERE quota > 0) quotas
    CROSS JOIN LATERAL (
        SELECT {cols("t")} FROM todos_todo t
        WHERE {S.RETRY_DUE.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s) AND {flow.not_expired("t")}
        -- NULLS FIRST (next_retry_at is never null here): only todo_retry_queue_due yields this order, so
        -- each queue's due range is one descent that stops after its quota. Across queues in due order,
        -- a generic plan once read every due retry of every queue through that index and sorted them.
        ORDER BY t.next_retry_at NULLS FIRST
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) d
),"""


# claim_next: up to %(limit)s todos in claim order (CLAIM_ORDER: priority, then run_at), from the
# caller's queues. Guard: _CLAIMABLE's cases, one branch each; locks: FOR UPDATE SKIP LOCKED per branch.
#  * Scope globs become concrete names through the small todos_queue table; then each queue's pending
#    rows are read by one descent of todo_pending_claim_scan (queue, priority, run_at) in claim order (a
#    LATERAL join), never by sorting every pending row (SPEC trap 1). Priority therefore holds within and
#    across the caller's queues, and for batch claims.
#  * Due scheduled todos come from todo_scheduled_due, also one descent per queue: the range
#    run_at <= now() ends at the first future row, so 1M todos scheduled for later cost a claim nothing.
#  * Plain queues only (issue 32): limited queues (max_claimed, a rate) are CLAIM_NEXT_LIMITED's, as keyed
#    ones are CLAIM_NEXT_FAIR's, so ``chosen`` is wave 1's, the candidates in claim order, and the statement
#    carries no queue-row lock, lease count, bucket write or per-queue quota: a plain queue pays nothing for
#    controls it does not use (bench/claim/pg_cpu.py; a limited queue pays this statement's row of NULLs
#    before its claim).
#  * Keyed queues (fair share, issue 22) are CLAIM_NEXT_FAIR's. When one is among the caller's queues, this
#    statement takes nothing and locks nothing (``quotas`` is empty) and returns one row
#    of NULLs instead: queue.claim_next then runs CLAIM_NEXT_FAIR, which claims from all of them, so
#    priority stays global across a scope of plain and fair queues. Telling costs a plain claim no read:
#    ``keyed`` comes from the queue rows it reads anyway, and PostgreSQL initialises no fair-share plan node
#    for it (issue 22: those nodes cost a plain claim about 0.25 ms, a quarter of its throughput).
#  * Due retries come from todo_retry_queue_due, one descent per queue as for scheduled todos (migration
#    0019). Lapsed leases are few (the reaper keeps them so); they come from their partial index in
#    expiry order.
#  * The branches other than pending are taken in time order and their rows compete with pending ones in
#    claim order: until the reaper moves them to pending (within a sweep), a more urgent one further down
#    such a branch may wait behind a less urgent one above it; taking them by priority would mean sorting
#    the whole branch on every claim.
#  * Every branch locks with SKIP LOCKED, so concurrent claimers never wait for or share a row. The
#    CTEs are MATERIALIZED and the UPDATE takes the chosen ids as an array, so the locking scans run
#    exactly once, never take more than %(limit)s rows, and the update is a primary-key lookup per id
#    whatever the plan guessed (a join to chosen was once served by hashing the whole table).
#  * A branch may lock up to %(limit)s rows per queue that the final LIMIT does not take; those locks
#    end with this statement's transaction, a millisecond later.
# The parameters a claim's plan is estimated with (the caller's queue patterns, the batch size where it bounds a
# scan or a sort) are hidden from the planner behind sub-selects. The claims are prepared once per connection
# (todos/rows.py), but the plan cache still plans a prepared statement afresh on every call while its custom
# plans (made knowing the values) cost less than its generic plan: a custom plan that knew LIMIT 1 costed the
# bounded sort of ``chosen`` about 3,600 units below the generic plan's, and known patterns can move the queue
# rows' estimate, so every claim was planned again, and planning cost more than running (issue 22's profile:
# a fair claim at 10,000 keys ~1.3 ms run, ~2.5-3 ms planned, its CLAIM_NEXT ~0.2 ms run, ~1.1 ms planned, on
# a loaded machine; plain claims on a large backlog alike). Unknown to every plan alike, the values make no
# custom plan cheaper, and the plan cache keeps the generic plan after its five trials
# (todos/tests/test_claim_plan.py). The executor still bounds the sort by the value.
_CALLERS = (
    "q.name LIKE ANY((SELECT %(scopes)s::text[])::text[]) AND q.name LIKE ANY((SELECT %(wanted)s::text[])::text[])"
)
_LIMIT = "(SELECT %(limit)s::integer)"
# The row that tells queue.claim_next to run CLAIM_NEXT_FAIR: every column NULL (a claimed todo's id never is).
_RUN_FAIR = "SELECT " + ", ".join("NULL" for _ in _RETURNING_T.split(","))
# CLAIM_NEXT's row of NULLs (issue 32): its kind says 'limited' when a limited queue (max_claimed, rate) and no
# keyed or flow one is among the caller's: queue.claim_next then runs CLAIM_NEXT_LIMITED, else CLAIM_NEXT_FAIR.
_RUN_LIMITED = "SELECT " + ", ".join(
    "CASE WHEN NOT EXISTS (SELECT FROM queues WHERE keyed OR flow) AND EXISTS (SELECT FROM queues WHERE limited) "
    "THEN 'limited' END"
    if c.strip() == "t.kind"
    else "NULL"
    for c in _RETURNING_T.split(",")
)
# Whether queue q has a reserved todo: the first row of its range of fair_ready_claim (ordered as the index, so the
# planner never reads the ready rows of every queue to find one).
_ANY_READY = "SELECT 1 FROM todos_fairready r WHERE r.queue = q.name ORDER BY r.priority, r.tag LIMIT 1"
# CLAIM_NEXT_FAIR's row of NULLs (issue 31): its kind says 'reserved' when the turn reserved todos.
_RESERVED = "SELECT " + ", ".join("'reserved'" if c.strip() == "t.kind" else "NULL" for c in _RETURNING_T.split(","))
# The candidates of CLAIM_NEXT and CLAIM_NEXT_LIMITED: each queue's pending rows in claim order, then the
# time-ordered branches, over ``quotas``.
_CANDIDATES = f"""pending AS MATERIALIZED (
    SELECT p.id, p.queue, p.priority, p.run_at, p.limits FROM quotas CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.limits FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s) AND {flow.not_expired("t")}
        -- NULLS FIRST (run_at is never null, so the order is the same) matches only todo_pending_claim_scan,
        -- so no other index can ever serve this order: the planner once served the claim from the admin's
        -- created_at index and walked the done history at its head on every claim (migration 0007: in a
        -- 45 s soak, 10,000 buffers a claim, throughput down by two thirds).
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) p
),
{_time_branches("id, queue, priority, run_at, limits")}
candidates AS (
    SELECT * FROM pending UNION ALL SELECT * FROM scheduled UNION ALL SELECT * FROM lapsed UNION ALL SELECT * FROM due
)"""

CLAIM_NEXT = f"""
WITH {_queue_quotas(_CALLERS)},
{_CANDIDATES},
-- The candidates in claim order, as wave 1 took them (no controlled queue reaches this point: ``quotas``).
chosen AS MATERIALIZED (
    SELECT id, queue, limits FROM candidates ORDER BY {CLAIM_ORDER} LIMIT {_LIMIT}
),
-- A chosen todo that names a limit (issue 31) is CLAIM_NEXT_FAIR's: this statement then takes nothing and
-- answers the row of NULLs. A plain todo's limits column is NULL: one test per chosen row.
handed AS MATERIALIZED (
    SELECT id, queue FROM chosen WHERE NOT EXISTS (SELECT FROM chosen c WHERE c.limits IS NOT NULL)
),
claimed AS (
    UPDATE todos_todo t SET {_CLAIM_SET}
    WHERE t.id = ANY(ARRAY(SELECT id FROM handed))
    RETURNING {_RETURNING_T}
)
SELECT * FROM claimed
UNION ALL
{_RUN_LIMITED}
WHERE EXISTS (SELECT FROM queues WHERE keyed OR flow OR limited) OR EXISTS (SELECT FROM chosen WHERE limits IS NOT NULL)
"""

# claim_next_limited (issue 32): CLAIM_NEXT as it was before issue 32, for a caller with a limited queue (max_claimed
# or a rate) among its queues and no keyed or flow one: queue.claim_next runs it when CLAIM_NEXT answers its row
# of NULLs marked kind = 'limited'. Guard, locks and indexes as CLAIM_NEXT's, plus _queue_quotas' lock and count
# of the limited queues' rows; it hands over to CLAIM_NEXT_FAIR (its own row of NULLs) as CLAIM_NEXT does.
CLAIM_NEXT_LIMITED = f"""
WITH {_queue_quotas(_CALLERS, limited=True)},
{_CANDIDATES},
chosen AS MATERIALIZED (
    -- No limited queue among the caller's (a one-time filter): the candidates in claim order, as wave 1
    -- took them.
    (SELECT id, queue, limits FROM candidates WHERE NOT EXISTS (SELECT FROM limited)
     ORDER BY {CLAIM_ORDER} LIMIT {_LIMIT})
    UNION ALL
    -- Otherwise nth, the candidate's place in its queue, keeps no queue above its quota.
    (SELECT id, queue, limits FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY {S.claim_order_sql("c")}) AS nth
        FROM candidates c WHERE EXISTS (SELECT FROM limited)
    ) ranked JOIN quotas ON quotas.name = ranked.queue
    WHERE ranked.nth <= quotas.quota
    ORDER BY {S.claim_order_sql("ranked")}
    LIMIT {_LIMIT})
),
-- A chosen todo that names a limit (issue 31) is CLAIM_NEXT_FAIR's: this statement then takes nothing (and
-- charges no bucket) and answers the row of NULLs. A plain todo's limits column is NULL: one test per chosen row.
handed AS MATERIALIZED (
    SELECT id, queue FROM chosen WHERE NOT EXISTS (SELECT FROM chosen c WHERE c.limits IS NOT NULL)
),
{_bucket("SELECT queue, count(*) AS n FROM handed GROUP BY queue")},
claimed AS (
    UPDATE todos_todo t SET {_CLAIM_SET}
    WHERE t.id = ANY(ARRAY(SELECT id FROM handed))
    RETURNING {_RETURNING_T}
)
SELECT * FROM claimed
UNION ALL
{_RUN_FAIR}
WHERE EXISTS (SELECT FROM queues WHERE keyed OR flow) OR EXISTS (SELECT FROM chosen WHERE limits IS NOT NULL)
"""

# claim_next_fair: CLAIM_NEXT when a keyed queue is among the caller's queues (queue.claim_next runs it when
# CLAIM_NEXT answers its row of NULLs), over all of them: what CLAIM_NEXT does for the plain ones, in one
# claim order with the keyed ones. Guard, locks and indexes as CLAIM_NEXT's, and for keyed queues as follows.
#
# Fair share (issue 22), on a keyed queue (fair, or max_claimed_per_key set). Each key k has a pass
# vtime(k) in todos_fairkey; the queue has a round R (fair_round). A key's next claim starts at
# start(k) = max(vtime(k), R): a key that was idle rejoins at the current round and banks no credit.
# Among the pending todos of the queue's most urgent priority, the claim takes the key with the lowest
# start (ties: the lower key, by its text), its todos in claim order; the j-th todo a claim takes from k is
# tagged start(k) + (j - 1) / weight(k), and a batch takes the lowest tags. Afterwards
# vtime(k) = start(k) + n / weight(k) (n: the todos taken from k). Weighted round robin: while keys stay
# busy, k gets weight(k) / (the busy keys' weights summed) of the claims.
#  * Priority stays global: the walk looks only at keys with pending work at the priority of the queue's
#    most urgent pending todo (one descent of todo_pending_claim_scan), and candidates are ordered by
#    (priority, tag). Fairness shares the queue among tenants; priority says what must go first, and an
#    urgent todo waiting behind other tenants' routine ones would defeat it.
#  * The walk (todos_fair_walk, migration 0016) reads todos_fairkey in (queue, vtime, key) order and
#    stops at the first %(limit)s keys with pending work at that priority (an EXISTS on todo_fair_pending)
#    and live leases below the cap, locking each FOR NO KEY UPDATE SKIP LOCKED. Since issue 31 the walk runs
#    under the queue row's lock (``limited``, _SERIALIZED): fair claimers of one queue take turns, one statement
#    each, so none skips a key another holds (that skipping let the light keys' claims through out of turn:
#    weights 3:1 came out 1.79:1 at 4 claimers). Only a claim by id (CLAIM_ONE, which also takes the queue's
#    row first) can hold a key meanwhile. The walk is a VOLATILE function: it must see the passes and leases
#    that claims committed after this statement's snapshot (issue 13: a snapshot older than the lock let 21
#    claims through a cap of 3), and a key updated meanwhile is re-checked on its latest row, cap count
#    included.
#  * The keys of lapsed, due and scheduled candidates are locked the same way (todos_fair_lock_key); they
#    compete by their key's tag and count toward its cap. A candidate whose key another claimer holds, or
#    that is at its cap, is left.
#  * R moves to the lowest start a claim took once it is a whole round (1) ahead, so it is written about
#    once a round rather than by every claim: a returning key may so start up to one round early, never
#    more. R is read from the locked row (``quotas``), never from the statement's older snapshot.
#  * A batch takes the %(limit)s lowest tags over the walked keys (the first %(limit)s keys by start: no
#    key beyond them has a lower first tag), as many from one key as its tags win (issue 31: 3 keys, limit 9:
#    3 each; one key, limit 30: 30), up to the key's room under max_claimed_per_key.
#  * Keys are registered by the todo table's triggers when they get pending work (migration 0016). The
#    key of the queue's most urgent pending todo is registered by the claim if it has no row (a create that
#    committed while the queue became fair): it is served from the next claim. A claim deletes those of the
#    8 lowest keys below the round that have nothing pending (lossless: such a key would rejoin at the
#    round anyway), after locking each (SKIP LOCKED: a create registering it holds it FOR KEY SHARE) and
#    re-checking with a fresh snapshot (todos_fair_key_pending).
#  * Plain queues run none of this: CLAIM_NEXT claims for a caller whose queues are all plain.
CLAIM_NEXT_FAIR = f"""
WITH {_queue_quotas(_CALLERS, fair=True, reserve=True)},
pending AS MATERIALIZED (
    SELECT p.id, p.queue, p.priority, p.run_at, p.fair_key, p.limits
    FROM (SELECT * FROM quotas WHERE NOT keyed) quotas CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key, t.limits FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = quotas.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s) AND {flow.not_expired("t")}
        -- NULLS FIRST (run_at is never null, so the order is the same) matches only todo_pending_claim_scan,
        -- so no other index can ever serve this order: the planner once served the claim from the admin's
        -- created_at index and walked the done history at its head on every claim (migration 0007: in a
        -- 45 s soak, 10,000 buffers a claim, throughput down by two thirds).
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT quotas.quota
        FOR UPDATE SKIP LOCKED
    ) p
),
fair_queues AS MATERIALIZED (
    SELECT k.name, k.quota, q.fair_weights, q.key_cap, k.fair_round, head.priority AS top, head.fair_key AS head_key,
        q.key_rate, k.reserving
    FROM (SELECT * FROM quotas WHERE keyed AND quota > 0) k JOIN queues q ON q.name = k.name
    -- With a fresh snapshot, after the queue's row is taken (quotas): this statement's snapshot may still show
    -- the todos the claimer before it took as pending, and a top priority only they had would walk no key.
    CROSS JOIN LATERAL todos_fair_head(k.name, %(agent)s) head
),
fair_register AS (
    INSERT INTO todos_fairkey (queue, key, vtime)
    SELECT fq.name, fq.head_key, 0 FROM fair_queues fq
    WHERE NOT EXISTS (SELECT FROM todos_fairkey k WHERE k.queue = fq.name AND k.key = fq.head_key)
    ON CONFLICT DO NOTHING
),
-- A key's room: what this claim may take from it. A reserving turn (quota: limit + FAIR_RESERVE) that walked
-- ``quota`` keys bounds it by tags: each walked key has a candidate tagged its start, so the quota-th lowest tag
-- is at most the highest start walked, and a key's j-th todo (tag start + (j - 1) / weight) beyond it cannot win;
-- without the bound every walked key's scan locked up to quota todos (33 keys x 33 at limit 1).
fair_keys AS MATERIALIZED (
    SELECT queue, key, start, weight, LEAST(quota, room, floor(tokens)::integer,
            CASE WHEN reserving AND count(*) OVER w >= quota
                THEN 1 + floor((max(start) OVER w - start) * weight + 1e-9)::integer END) AS room,
        tokens, key_rate
    FROM (
        SELECT fq.name AS queue, fq.quota, fq.reserving, w.key, GREATEST(w.vtime, fq.fair_round) AS start, wt.weight,
            CASE WHEN fq.key_cap IS NOT NULL THEN fq.key_cap - todos_fair_live_leases(fq.name, w.key) END AS room,
            -- a per-key rate (issue 31): the key's bucket, read fresh under its lock; NULL without rate_per_key
            todos_fair_key_tokens(fq.name, w.key, fq.key_rate * wt.weight) AS tokens,
            fq.key_rate * wt.weight AS key_rate
        FROM fair_queues fq CROSS JOIN LATERAL todos_fair_walk(
            fq.name, fq.top, %(agent)s, fq.quota, fq.key_cap, fq.key_rate, fq.fair_weights) w
        CROSS JOIN LATERAL (SELECT COALESCE((fq.fair_weights ->> w.key)::double precision, 1) AS weight) wt
    ) k
    WINDOW w AS (PARTITION BY queue)
),
-- Each walked key's todos from its first pending one now (todos_fair_key_first, a fresh snapshot): this
-- statement's snapshot still shows the todos the claimers before it took as pending, and a scan from the key's
-- head re-checked each of them under the queue's lock. A reserved todo (todos_fairready) is skipped, read fresh
-- (todos_fair_reserved): the reservations the turn before this one committed are not in this statement's snapshot.
fair_pending AS MATERIALIZED (
    SELECT p.id, p.queue, p.priority, p.run_at, p.fair_key, p.limits FROM fair_keys fk
    CROSS JOIN LATERAL todos_fair_key_first(fk.queue, fk.key, %(agent)s) head CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key, t.limits FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = fk.queue AND t.fair_key = fk.key
          AND (t.priority, t.run_at) >= (head.priority, head.run_at)
          AND (t.assignee IS NULL OR t.assignee = %(agent)s) AND {flow.not_expired("t")}
          AND NOT todos_fair_reserved(t.id)
        ORDER BY t.priority, t.run_at
        LIMIT fk.room
        FOR UPDATE SKIP LOCKED
    ) p
),
{_time_branches("id, queue, priority, run_at, fair_key, limits")}
candidates AS (
    SELECT * FROM pending UNION ALL SELECT * FROM scheduled UNION ALL SELECT * FROM lapsed UNION ALL SELECT * FROM due
),
-- A keyed queue's candidate keys, locked, with their start, weight and room under the cap: the walked ones,
-- and the keys of lapsed, due and scheduled candidates.
fair_rooms AS MATERIALIZED (
    SELECT * FROM fair_keys
    UNION ALL
    SELECT k.queue, lk.key, GREATEST(lk.vtime, qu.fair_round), w.weight,
        LEAST(%(limit)s::integer,
            CASE WHEN q.key_cap IS NOT NULL THEN q.key_cap - todos_fair_live_leases(k.queue, lk.key) END,
            floor(todos_fair_key_tokens(k.queue, lk.key, q.key_rate * w.weight))::integer),
        todos_fair_key_tokens(k.queue, lk.key, q.key_rate * w.weight), q.key_rate * w.weight
    FROM (
        SELECT DISTINCT c.queue, c.fair_key FROM candidates c JOIN queues q ON q.name = c.queue AND q.keyed
        WHERE NOT EXISTS (SELECT FROM fair_keys fk WHERE fk.queue = c.queue AND fk.key = c.fair_key)
    ) k JOIN queues q ON q.name = k.queue JOIN quotas qu ON qu.name = k.queue
    CROSS JOIN LATERAL todos_fair_lock_key(k.queue, k.fair_key, q.key_cap, false) lk
    CROSS JOIN LATERAL (SELECT COALESCE((q.fair_weights ->> lk.key)::double precision, 1) AS weight) w
),
-- Named limits (issue 31, todos/sql/flow.py): the candidates held by a limit, and those the limits refuse.
flow_pool AS MATERIALIZED (
    SELECT c.id, c.queue, c.priority, c.run_at, c.fair_key, {flow.held_by("c.limits", "q.qlimits")} AS lims,
        q.fair_weights AS weights
    FROM (SELECT * FROM candidates UNION ALL SELECT * FROM fair_pending) c JOIN queues q ON q.name = c.queue
    WHERE c.limits IS NOT NULL OR q.qlimits IS NOT NULL
),
{flow.claim_ctes("flow_pool")}
chosen AS MATERIALIZED (
    -- No limited or keyed queue among the caller's (a one-time filter): the candidates in claim order, as
    -- wave 1 took them.
    (SELECT id, queue, fair_key, priority, NULL::double precision AS tag, 0::bigint AS ord FROM candidates
     WHERE NOT EXISTS (SELECT FROM queues WHERE limited OR keyed) AND id NOT IN (SELECT id FROM flow_blocked)
     ORDER BY {CLAIM_ORDER} LIMIT {_LIMIT})
    UNION ALL
    -- Otherwise nth, the candidate's place in its queue, keeps no queue above its quota; in a keyed queue
    -- the candidates go by (priority, tag), only those of keys this claim holds, no key above its room. ord:
    -- the place in that order (a reserving turn claims ord <= limit and reserves the rest).
    (SELECT id, queue, fair_key, ranked.priority, tag,
        row_number() OVER (ORDER BY ranked.priority, ranked.tag NULLS LAST, ranked.run_at) AS ord FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.tag, c.run_at) AS nth
        FROM (
            SELECT c.*, r.key AS held, r.room, r.start + (c.nth_key - 1) / r.weight AS tag FROM (
                SELECT c.*,
                    row_number() OVER (PARTITION BY c.queue, c.fair_key ORDER BY c.priority, c.run_at) AS nth_key
                FROM (SELECT * FROM candidates UNION ALL SELECT * FROM fair_pending) c
                WHERE EXISTS (SELECT FROM queues WHERE limited OR keyed) AND c.id NOT IN (SELECT id FROM flow_blocked)
            ) c LEFT JOIN fair_rooms r ON r.queue = c.queue AND r.key = c.fair_key
        ) c JOIN quotas ON quotas.name = c.queue
        WHERE NOT quotas.keyed OR (c.held IS NOT NULL AND c.nth_key <= c.room)
    ) ranked JOIN quotas ON quotas.name = ranked.queue
    WHERE ranked.nth <= quotas.quota
    ORDER BY ranked.priority, ranked.tag NULLS LAST, ranked.run_at
    LIMIT {_LIMIT} + CASE WHEN EXISTS (SELECT FROM quotas WHERE reserving) THEN {_RESERVE} ELSE 0 END)
),
-- What this claim takes: the first %(limit)s.
taken AS MATERIALIZED (
    SELECT id, queue, fair_key FROM chosen WHERE ord <= %(limit)s
),
-- What a reserving turn reserves (issue 31): the chosen beyond %(limit)s, each a pending todo of the reserving
-- queue from its keys' scans with no assignee and no named limit, while every one before it in (priority, tag)
-- order is too (the charged todos stay a prefix of the tag order, so the passes stay exact). The rest of chosen
-- is neither taken nor charged: its row locks end with this transaction.
extra AS MATERIALIZED (
    SELECT c.id, c.queue, c.fair_key, c.priority, c.tag, c.ord,
        (quotas.reserving AND c.id IN (SELECT id FROM fair_pending) AND t.assignee IS NULL AND t.limits IS NULL)
            AS ok
    FROM chosen c JOIN quotas ON quotas.name = c.queue JOIN todos_todo t ON t.id = c.id
    WHERE c.ord > %(limit)s
),
reserved AS MATERIALIZED (
    SELECT id, queue, fair_key, priority, tag FROM extra
    WHERE ok AND ord < COALESCE((SELECT min(ord) FROM extra WHERE NOT ok), 2147483647)
),
fair_taken AS MATERIALIZED (
    SELECT r.queue, r.key, r.start, r.weight, r.tokens, r.key_rate, count(*) AS n
    FROM (SELECT queue, fair_key FROM taken UNION ALL SELECT queue, fair_key FROM reserved) chosen
    JOIN fair_rooms r ON r.queue = chosen.queue AND r.key = chosen.fair_key
    GROUP BY 1, 2, 3, 4, 5, 6
),
-- An UPDATE, not an upsert: a key registered by this very statement (todos_fair_lock_key, fair_register) is
-- not in its snapshot, and an upsert of it would fail ("cannot affect row a second time"); such a key keeps
-- pass 0 and starts at the round at its next claim as well (one turn early, once).
fair_state AS (
    UPDATE todos_fairkey k SET vtime = ft.start + ft.n / ft.weight,
        -- a per-key rate's bucket, written back under the key's lock (issue 31)
        tokens = CASE WHEN ft.key_rate IS NOT NULL THEN ft.tokens - ft.n ELSE k.tokens END,
        refilled_at = CASE WHEN ft.key_rate IS NOT NULL THEN now() ELSE k.refilled_at END
    FROM fair_taken ft WHERE k.queue = ft.queue AND k.key = ft.key
),
fair_round AS (
    UPDATE todos_queue q SET fair_round = r.round
    FROM (SELECT queue, min(start) AS round FROM fair_taken GROUP BY queue) r
    WHERE q.name = r.queue AND r.round >= q.fair_round + 1
),
-- The 8 lowest keys below the round, those of them with nothing pending (checked on these 8 only: a scan
-- that went on until it found 8 idle keys would pass every busy key below the round).
fair_idle AS MATERIALIZED (
    SELECT k.queue, k.key FROM (SELECT name, fair_round FROM queues WHERE keyed) q CROSS JOIN LATERAL (
        SELECT k.queue, k.key FROM todos_fairkey k
        WHERE k.queue = q.name AND k.vtime <= q.fair_round
        ORDER BY k.vtime, k.key
        LIMIT 8
    ) k
    WHERE NOT EXISTS (SELECT FROM fair_rooms r WHERE r.queue = k.queue AND r.key = k.key)
      AND NOT EXISTS (SELECT FROM todos_todo t WHERE t.queue = k.queue AND t.fair_key = k.key AND {S.PENDING.sql("t")})
),
fair_pruned AS (
    DELETE FROM todos_fairkey k
    WHERE (k.queue, k.key) IN (
        SELECT l.queue, l.key FROM todos_fairkey l JOIN fair_idle i ON l.queue = i.queue AND l.key = i.key
        FOR UPDATE OF l SKIP LOCKED
    ) AND NOT todos_fair_key_pending(k.queue, k.key)
),
{_bucket("SELECT queue, count(*) AS n FROM taken GROUP BY queue")},
{flow.bucket("flow_pool", "SELECT id FROM taken")},
-- The reserved todos, for CLAIM_FAIR_READY; committed with the passes that charged them.
fair_reserve AS (
    INSERT INTO todos_fairready (id, queue, priority, tag, fair_key)
    SELECT id, queue, priority, tag, fair_key FROM reserved
    ON CONFLICT DO NOTHING
),
-- This transaction commits without waiting for its WAL to reach disk (synchronous_commit off, local to it: a
-- claim in autocommit is its own transaction). The queue's row is held until commit, so the flush was inside
-- every fair claimer's turn, one after another; the next claimer sees the commit at once (visibility does not
-- wait for the flush). What a database crash can lose is the last few hundred milliseconds of fair claims: their
-- todos are pending again, as after a lapsed lease (at-least-once delivery; the holder's next step is a 409),
-- and the keys' passes and buckets written with them. Creates and completions keep synchronous commits.
fair_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS setting),
claimed AS (
    UPDATE todos_todo t SET {_CLAIM_SET}
    WHERE t.id = ANY(ARRAY(SELECT id FROM taken)) AND EXISTS (SELECT FROM fair_commit)
    RETURNING {_RETURNING_T}
)
SELECT * FROM claimed
UNION ALL
-- A row of NULLs marked kind = 'reserved' when this turn reserved, or a reservable queue of the caller's has reserved
-- todos (another process's: one probe of fair_ready_claim each): queue.claim_next strips it and runs
-- CLAIM_FAIR_READY first on its next claims of these (scopes, queues).
{_RESERVED}
WHERE EXISTS (SELECT FROM reserved)
   OR EXISTS (SELECT FROM (SELECT name FROM queues WHERE reservable) q CROSS JOIN LATERAL ({_ANY_READY}) r)
"""

# claim_fair_ready (issue 31, reservations): up to %(limit)s reserved todos (todos_fairready), without the queue's
# lock. A contended fair turn (CLAIM_NEXT_FAIR, ``reserving``) charged them to their keys' passes and left them
# here in (priority, tag) order; this statement hands them out in that order, so a turn (~1.2 ms under the queue's
# row at 16 claimers on 2 cores) serves up to 1 + FAIR_RESERVE claims.
#  * Scopes: only of the caller's queues (``queues``: claim scopes, the wanted filter, not paused, as every
#    claim), and only of those still reservable now (fair, none of the controls: _reservable). A PATCH that
#    makes a queue unreservable deletes its rows in its own transaction (controls.set_limits); a row it deleted,
#    or is deleting, is skipped by the lock below.
#  * Priority stays global: a ready row is taken only while no pending todo of the caller's queues is more
#    urgent (``top``: one descent of todo_pending_claim_scan per queue; a reserved todo is pending too, and never
#    more urgent than the ready rows it is taken with, so ``top`` needs no anti-join). A todo created more urgent
#    than the reservations goes first, through the fair turn.
#  * Lock: the ready rows FOR UPDATE SKIP LOCKED, in (priority, tag) order (index fair_ready_claim: queue,
#    priority, tag), deleted in the same statement; concurrent fast claimers never share or wait for one. The
#    todo row is then updated under the full claim guard (_CLAIMABLE, pending, not expired, the assignee and, by
#    _within_budget, the tree budget): a ready row whose todo is no longer claimable (cancelled, claimed by id,
#    expired, deleted: there is no foreign key) is just deleted.
#  * Normal synchronous commit: it holds no lock another claimer waits for.
CLAIM_FAIR_READY = f"""
WITH {_plain_queues(_CALLERS)},
ready_queues AS MATERIALIZED (
    SELECT q.name FROM queues JOIN todos_queue q ON q.name = queues.name WHERE {reservable("q")}
),
top AS MATERIALIZED (
    SELECT min(h.priority) AS priority FROM queues CROSS JOIN LATERAL (
        SELECT t.priority FROM todos_todo t
        WHERE {S.PENDING.sql("t")} AND t.queue = queues.name
          AND (t.assignee IS NULL OR t.assignee = %(agent)s) AND {flow.not_expired("t")}
        ORDER BY t.priority, t.run_at NULLS FIRST
        LIMIT 1
    ) h
),
-- Each queue's ready rows in (priority, tag) order, one range scan of fair_ready_claim per queue (a LATERAL join,
-- as the pending branch: a semi-join to the queues was planned as a bitmap scan and sort of every ready row).
-- The rows a queue locks beyond what ``picked`` takes stay as they are; their locks end with this transaction.
ready AS MATERIALIZED (
    SELECT r.id, r.priority, r.tag FROM ready_queues q CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.tag FROM todos_fairready r
        WHERE r.queue = q.name
          -- no pending todo at all (stale rows of finished todos): taken, and deleted as met
          AND r.priority <= COALESCE((SELECT priority FROM top), 32767)
        ORDER BY r.priority, r.tag
        LIMIT {_LIMIT}
        FOR UPDATE OF r SKIP LOCKED
    ) r
),
picked AS MATERIALIZED (
    SELECT id FROM ready ORDER BY priority, tag LIMIT {_LIMIT}
),
ready_gone AS (
    DELETE FROM todos_fairready r WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
),
claimed AS (
    UPDATE todos_todo t SET {_CLAIM_SET}
    WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND t.queue IN (SELECT name FROM ready_queues)
      AND {S.PENDING.sql("t")} AND {_CLAIMABLE}
    RETURNING {_RETURNING_T}
)
SELECT * FROM claimed
UNION ALL
-- Took none while reservations remain (a more urgent todo goes first, or other claimers hold them): the row of
-- NULLs marked 'reserved', so queue.claim_next keeps asking this statement first. One probe of fair_ready_claim.
{_RESERVED}
WHERE NOT EXISTS (SELECT FROM ready) AND EXISTS (SELECT FROM ready_queues q CROSS JOIN LATERAL ({_ANY_READY}) r)
"""

# claim: this one todo, if the caller may claim from its queue, it is claimable, and its queue's
# controls let one more through (the same _queue_quotas as CLAIM_NEXT_FAIR); on a queue with
# max_claimed_per_key, its key too, locked as CLAIM_NEXT_FAIR locks keys (waiting for a claimer holding it).
# Guard: _CLAIMABLE on the row; lock: the row's (the UPDATE) and a limited queue's; index: the primary key.
# A concurrent claim of the same row waits for the first and then re-checks the guard, so only one wins. A
# claim by id is outside the round robin: it does not move the key's pass. On any other queue it reads no
# more than before fair share: the todo's key is looked up (a second read of its row) only when key_cap is
# set.
_ITS_QUEUE = "q.name = (SELECT queue FROM todos_todo WHERE id = %(id)s) AND q.name LIKE ANY(%(scopes)s::text[])"
CLAIM_ONE = f"""
WITH {_queue_quotas(_ITS_QUEUE, fair=True)},
-- Its key at its cap (or never locked): checked only on a queue with max_claimed_per_key (key_cap IS NOT
-- NULL comes first), so a claim on any other queue reads no more rows than before fair share.
-- The key is locked after the queue's row (the join to quotas, whose ``limited`` locks it, comes first: the
-- lock call names qu), the order fair claims lock in, so a claim by id and a fair claim cannot deadlock.
key_full AS MATERIALIZED (
    SELECT FROM queues q JOIN quotas qu ON qu.name = q.name
    WHERE q.key_cap IS NOT NULL AND NOT EXISTS (
        SELECT FROM todos_todo t
        WHERE t.id = %(id)s AND EXISTS (SELECT FROM todos_fair_lock_key(qu.name, t.fair_key, q.key_cap, true)))
),
-- Its named limits (issue 31), locked after its queue's row (the join to quotas).
one_pool AS MATERIALIZED (
    SELECT t.id, t.queue, t.priority, t.run_at, t.fair_key, {flow.held_by("t.limits", "q.qlimits")} AS lims,
        q.fair_weights AS weights
    FROM todos_todo t JOIN queues q ON q.name = t.queue JOIN quotas qu ON qu.name = t.queue
    WHERE t.id = %(id)s AND (t.limits IS NOT NULL OR q.qlimits IS NOT NULL)
),
{flow.claim_ctes("one_pool")}
claimed AS (
    UPDATE todos_todo t SET {_CLAIM_SET}
    WHERE t.id = %(id)s AND t.queue IN (SELECT name FROM quotas WHERE quota > 0) AND {_CLAIMABLE}
      AND NOT EXISTS (SELECT FROM key_full) AND NOT EXISTS (SELECT FROM flow_blocked)
    RETURNING {_RETURNING_T}
),
{_bucket("SELECT queue, count(*) AS n FROM claimed GROUP BY queue")},
{flow.bucket("one_pool", "SELECT id FROM claimed")}
SELECT * FROM claimed
"""


# Budgets (issue 30): every branch of every claim takes only todos whose tree's budget is not spent, a test
# written beside the assignee rule that each branch carries (todos/sql/trees.py, BUDGET_OPEN: for a todo
# outside any tree two column tests, no read). Explain (todos/explain.py) tests the same fragment.
_ASSIGNEE = "(t.assignee IS NULL OR t.assignee = %(agent)s)"


def _within_budget(statement: str) -> str:
    assert _ASSIGNEE in statement, "every claim branch tests the assignee rule"
    return statement.replace(_ASSIGNEE, f"{_ASSIGNEE} AND {BUDGET_OPEN}")


CLAIM_NEXT = _within_budget(CLAIM_NEXT)
CLAIM_NEXT_LIMITED = _within_budget(CLAIM_NEXT_LIMITED)
CLAIM_NEXT_FAIR = _within_budget(CLAIM_NEXT_FAIR)
CLAIM_FAIR_READY = _within_budget(CLAIM_FAIR_READY)
CLAIM_ONE = _within_budget(CLAIM_ONE)
