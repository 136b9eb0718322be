"""Agent trees, issue 30 items 3-6: cascading cancel (todos_cascade, migration 0027), a cancelled todo's late
result, and budgets (usage reported by a receipt's holder, rolled up to its root, and the claim's budget
predicate).
"""

from todos import limits
from todos import states as S
from todos.sql.common import _TODO_COLUMNS, NOTIFY_CHANNEL, holder_is

# --- Cascading cancel ------------------------------------------------------------------------------------

# cancel with cascade (queue.cancel, in the cancel's transaction, after CANCEL) and reap_once's resumption: up to
# %(bound)s unfinished descendants of %(ids)s in the queues %(visible)s -> cancelled, each recording
# 'ancestor <id> <why>'; a cascade that took a whole bound marks the ancestor (cascade) for reap_once. Walk:
# parent_id through todo_children; locks: the rows it cancels. todos/sql/functions/todos_cascade.sql.
CASCADE = """
SELECT todos_cascade(%(ids)s::text[], %(by)s::text, %(why)s::text, %(visible)s::text[], %(bound)s::integer)
"""

# Which of %(ids)s a cancel may take now (CANCELLABLE, in the caller's queues): a cascade cancels their
# descendants first, then CANCEL takes them, so that it locks a tree's rows in the order a child's report
# with usage does (the child, then its root) and never waits crosswise with one. No lock: a todo that finishes
# meanwhile is refused by CANCEL's own guard (its descendants, cancelled by then, stay cancelled).
CANCELLABLE_IDS = f"""
SELECT t.id FROM todos_todo t
WHERE t.id = ANY(%(ids)s::text[]) AND {S.CANCELLABLE.sql("t")} AND t.queue LIKE ANY(%(visible)s::text[])
"""

# Cascades left over (reap_once): the ancestors marked by a cascade that took a whole bound, from the partial
# index todo_cascade_pending (a handful of rows at most). No lock: two reapers resuming the same cascade
# cancel disjoint rows (each row's guard is re-checked under its lock) or none.
CASCADES_LEFT = """
SELECT id, cascade ->> 'by', cascade ->> 'reason', ARRAY(SELECT jsonb_array_elements_text(cascade -> 'visible'))
FROM todos_todo WHERE cascade IS NOT NULL ORDER BY id LIMIT %(n)s
"""

# A late complete (queue.complete, after COMPLETE matched nothing on a cancelled todo): the holder of the
# receipt a cancel revoked (revoked_lease_id, the same agent, a queue it may see) keeps its result on the
# todo as a tombstone, once (the first late result wins), not applied: the state stays cancelled, the
# result column untouched and no dependent is settled again. Guard: the WHERE; lock: the row.
LATE_RESULT = f"""
UPDATE todos_todo t SET
    late_result = jsonb_build_object('result', %(result)s::jsonb, 'at', now(), 'owner', t.owner),
    updated_at = now()
WHERE t.id = %(id)s AND t.revoked_lease_id = %(lease_id)s AND {holder_is("t")}
  AND t.queue LIKE ANY(%(visible)s::text[]) AND t.state = 'cancelled' AND t.late_result IS NULL
RETURNING t.id
"""

# --- Budgets ---------------------------------------------------------------------------------------------


def exhausted(usage: str, budget: str) -> str:
    """SQL: some counter of ``budget`` ({name: limit}) has reached its limit in ``usage`` ({name: number})."""
    return f"""EXISTS (SELECT FROM jsonb_each_text({budget}) e
        WHERE COALESCE(({usage} ->> e.key)::numeric, 0) >= e.value::numeric)"""


_ADD = f"todos_usage_add({{}}, %(usage)s::jsonb, {limits.MAX_USAGE_COUNTERS})"

# The budget predicate of every claim branch (todos/sql/claim.py) and of explain: the todo (alias t) is not in a
# tree whose budget is spent. A todo outside any tree (root_id NULL, budget_exhausted NULL: every todo created
# without a parent) costs two column tests and no read; a child probes its root by primary key.
BUDGET_OPEN = """(t.budget_exhausted IS NOT TRUE
    AND (t.root_id IS NULL OR NOT EXISTS (SELECT FROM todos_todo b WHERE b.id = t.root_id AND b.budget_exhausted)))"""

# Part of the SET list of a receipt holder's heartbeat or complete (todos/sql/lease.py), no alias: adds
# %(usage)s (NULL: none reported) to the todo's usage and, for a root, to its tree_usage, deciding
# budget_exhausted on the sum. SET reads the row's latest version (under its lock), so concurrent reports add up.
# Without usage (most reports) every column keeps its value and no function runs.
USAGE_SET = f"""
    usage = CASE WHEN %(usage)s::jsonb IS NULL THEN usage ELSE {_ADD.format("usage")} END,
    tree_usage = CASE WHEN root_id IS NULL AND %(usage)s::jsonb IS NOT NULL THEN {_ADD.format("tree_usage")}
        ELSE tree_usage END,
    budget_exhausted = CASE WHEN root_id IS NULL AND budget IS NOT NULL AND %(usage)s::jsonb IS NOT NULL
        THEN {exhausted(_ADD.format("tree_usage"), "budget")} ELSE budget_exhausted END"""

# The CTE that rolls a child's reported usage up to its root, in the same statement (after ``changed``, the
# child as updated under its receipt): the root's tree_usage and budget_exhausted. Lock order: the child
# (its UPDATE), then its root; the UPDATE re-reads the root's latest version after waiting, so concurrent
# reports of one tree add up exactly. Nothing runs without usage (a one-time filter) or for a root.
ROLLED_UP = f"""rolled AS (
    UPDATE todos_todo r SET
        tree_usage = {_ADD.format("r.tree_usage")},
        budget_exhausted = CASE WHEN r.budget IS NULL THEN r.budget_exhausted
            ELSE {exhausted(_ADD.format("r.tree_usage"), "r.budget")} END
    FROM changed c WHERE %(usage)s::jsonb IS NOT NULL AND r.id = c.root_id
    RETURNING r.id
),
"""

# Whether a todo's tree has spent its budget: the root's flag (by primary key).
TREE_BLOCKED = """
SELECT COALESCE(budget_exhausted, false) FROM todos_todo WHERE id = %(root)s
"""

# set_budget (an operator: staff or a can-manage agent): a root's budget, replaced, and budget_exhausted
# decided again on its tree_usage: raising it unblocks the tree at once. Guard: a root (root_id NULL) in the
# caller's scopes; lock: the row. Notifies the root's queue when the tree is open (its pending todos may be
# claimable again); a tree spread over other queues is found by their next claim.
SET_BUDGET = f"""
WITH changed AS (
    UPDATE todos_todo t SET
        budget = %(budget)s::jsonb,
        budget_exhausted = {exhausted("t.tree_usage", "%(budget)s::jsonb")},
        updated_at = now()
    WHERE t.id = %(id)s AND t.root_id IS NULL AND t.queue LIKE ANY(%(visible)s::text[])
    RETURNING {_TODO_COLUMNS}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', queue) FROM changed WHERE NOT budget_exhausted
)
SELECT changed.* FROM changed CROSS JOIN (SELECT count(*) FROM notified) n
"""

# --- Orphans (the dashboard) ------------------------------------------------------------------------------

# Children whose parent finished unsuccessfully (cancelled, a dead-letter) while they are unfinished: what a
# parent with children: "keep" leaves behind. Walks the unfinished children (todo_children, partial: children
# only), at most %(cap)s of them (the dashboard says "at least" past it), probing each parent by primary key.
ORPHANS = f"""
SELECT count(*) FROM (
    SELECT c.parent_id FROM todos_todo c
    WHERE c.parent_id IS NOT NULL AND NOT ({S.FINISHED.sql("c")})
    LIMIT %(cap)s
) c JOIN todos_todo p ON p.id = c.parent_id
WHERE {(S.CANCELLED | S.DEAD_LETTER).sql("p")}
"""

# Usage of the todos completed in the last %(minutes)s minutes, per queue and per agent (its last claimer),
# counter by counter (the dashboard). The done rows of the window come from todo_done_recent (completed_at,
# partial: done), as the dashboard's completions per minute do; a todo without usage costs a null test.
RECENT_USAGE = f"""
WITH recent AS MATERIALIZED (
    SELECT t.queue, split_part(t.owner, '/', 1) AS agent, t.usage FROM todos_todo t
    WHERE {S.DONE.sql("t")} AND t.completed_at >= now() - make_interval(mins => %(minutes)s)
      AND t.usage IS NOT NULL
)
SELECT 'queue', r.queue, e.key, sum(e.value::numeric) FROM recent r, jsonb_each_text(r.usage) e GROUP BY 2, 3
UNION ALL
SELECT 'agent', r.agent, e.key, sum(e.value::numeric) FROM recent r, jsonb_each_text(r.usage) e GROUP BY 2, 3
ORDER BY 1, 2, 3
"""

__all__ = [
    "BUDGET_OPEN",
    "CANCELLABLE_IDS",
    "CASCADE",
    "CASCADES_LEFT",
    "LATE_RESULT",
    "ORPHANS",
    "RECENT_USAGE",
    "ROLLED_UP",
    "SET_BUDGET",
    "TREE_BLOCKED",
    "USAGE_SET",
    "exhausted",
]
