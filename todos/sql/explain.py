"""Why isn't it running (issue 30, item 6): the reads behind GET /todos/<id>/explain/ and
GET /agents/me/explain/. Each reason is tested with the claim's own fragment: the states of todos/states.py
(S.CLAIMABLE and its parts), the assignee rule and BUDGET_OPEN that every claim branch carries, and the queue
controls' expressions below, which todos/tests/test_tree_explain.py checks are the claim statements' own text
(so the explanation cannot drift from the claim without a test failing)."""

from todos import states as S
from todos.sql.trees import BUDGET_OPEN

# The claim's fragments, as todos/sql/claim.py writes them (alias q: todos_queue; t: todos_todo).
ASSIGNEE = "(t.assignee IS NULL OR t.assignee = %(agent)s)"
PAUSED = "NOT q.paused"
TOKENS = """LEAST(q.rate_burst::double precision, q.tokens
            + GREATEST(EXTRACT(EPOCH FROM now() - q.refilled_at)::double precision, 0) * q.rate_per_second)"""
LIVE_LEASES = "todos_live_leases(name)"

# One todo as the caller may see it (404 otherwise), with each thing a claim of it tests, in explain's order.
# Reads the todo by primary key, its queue row, and (only when the queue has the control) the live leases of
# the queue (todo_live_leases) or of its fair key; the root by primary key for a child. No lock.
EXPLAIN_TODO = f"""
SELECT t.queue, t.state, {S.DEAD_LETTER.sql("t")} AS dead_letter, {S.CLAIMABLE.sql("t")} AS claimable_state,
    {S.LIVE_LEASE.sql("t")} AS live_lease, t.waiting_for, t.dependencies_left, t.run_at,
    t.run_at > now() AS run_at_ahead, t.next_retry_at, t.assignee, {ASSIGNEE} AS assignee_ok,
    q.name IS NOT NULL AS registered, COALESCE(q.paused, false) AS paused,
    q.max_claimed, CASE WHEN q.max_claimed IS NOT NULL THEN todos_live_leases(q.name) END AS live_leases,
    q.rate_per_second, CASE WHEN q.rate_per_second IS NOT NULL THEN {TOKENS} END AS tokens,
    q.max_claimed_per_key, CASE WHEN q.max_claimed_per_key IS NOT NULL
        THEN todos_fair_live_leases(q.name, t.fair_key) END AS key_leases,
    COALESCE(q.fair, false) AS fair, t.fair_key,
    -- reserved by a contended fair turn (issue 31): its key's turn is already given, the next claims take it
    EXISTS (SELECT FROM todos_fairready r WHERE r.id = t.id AND r.queue = t.queue) AS reserved,
    {BUDGET_OPEN} AS budget_open, COALESCE(t.root_id, t.id) AS root,
    (SELECT max(c.claimed_at) FROM todos_todo c WHERE c.queue = t.queue AND {S.CLAIMED.sql("c")}) AS last_claimed_at
FROM todos_todo t LEFT JOIN todos_queue q ON q.name = t.queue
WHERE t.id = %(id)s AND t.queue LIKE ANY(%(visible)s::text[])
"""

# An agent's queues (its claim scopes, narrowed by %(wanted)s), at most %(n)s, each with its controls and
# whether a claim by %(agent)s would find a todo there: the claim's own tests, as in EXPLAIN_TODO, and why
# not (pending todos blocked by a budget, assigned to another agent, scheduled ahead). Each probe stops at its
# first row.
EXPLAIN_AGENT = f"""
SELECT q.name, q.paused,
    q.max_claimed, CASE WHEN q.max_claimed IS NOT NULL THEN todos_live_leases(q.name) END AS live_leases,
    q.rate_per_second, CASE WHEN q.rate_per_second IS NOT NULL THEN {TOKENS} END AS tokens,
    EXISTS (SELECT FROM todos_todo t WHERE t.queue = q.name AND {S.CLAIMABLE.sql("t")} AND {ASSIGNEE}
            AND {BUDGET_OPEN}) AS takeable,
    EXISTS (SELECT FROM todos_todo t WHERE t.queue = q.name AND {S.PENDING.sql("t")}
            AND NOT {BUDGET_OPEN}) AS budget_blocked,
    EXISTS (SELECT FROM todos_todo t WHERE t.queue = q.name AND {S.PENDING.sql("t")}
            AND NOT {ASSIGNEE}) AS assigned_elsewhere,
    EXISTS (SELECT FROM todos_todo t WHERE t.queue = q.name AND {S.SCHEDULED.sql("t")}) AS scheduled
FROM todos_queue q
WHERE q.name LIKE ANY(%(scopes)s::text[]) AND q.name LIKE ANY(%(wanted)s::text[])
ORDER BY q.name
LIMIT %(n)s
"""
