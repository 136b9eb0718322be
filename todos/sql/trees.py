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
# tree whose budget is spent. A root reads its own flag. A child's budget_exhausted is a marker, never true:
# false when its tree's root has a budget (set by the create, sql.SPAWN, or by set_budget, MARK_BUDGETED), NULL
# otherwise. So a todo outside any tree, and a child of a tree without a budget, cost two column tests and no
# read; a child of a budgeted tree probes its root by primary key, once per row the claim tests. A scalar
# subquery, not EXISTS: the planner turned NOT EXISTS into a hashed SubPlan that read every row of todos_todo
# with budget_exhausted set (a sequential scan of the table) on each claim that met a tree's todo.
BUDGET_OPEN = """(t.budget_exhausted IS NOT TRUE AND (t.root_id IS NULL OR t.budget_exhausted IS NULL
    OR (SELECT b.budget_exhausted FROM todos_todo b WHERE b.id = t.root_id) IS NOT TRUE))"""

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


# Lock order in a tree: ancestors first, everywhere. A finish with children: "cancel" locks the todo, then
# (its trigger's cascade) what is below it; queue.cancel(cascade=True) cancels the todos, then their
# descendants; a create under a parent locks the root, then the parent (todos/sql/create.py, SPAWN). So a
# statement that finishes or reports on a todo of a tree and will then lock one of its ancestors locks them
# first: ancestors_first(), a test in the WHERE of its UPDATE, run as the scan tests the todo's row (its
# snapshot version), before the UPDATE locks that row. It locks the root (depth NULL) and then the parent, by
# primary key. A todo outside any tree (root_id NULL), a report without usage, a complete nobody waits for:
# the test's first terms settle it and nothing runs (the plain statements' cost). Two reasons to lock them:
# - a report with usage rolls it up to the root (ROLLED_UP): the root. A child that reported while holding its
#   row and then waited for its root, while the root's finish with children: "cancel" held the root and waited
#   for the child, was a deadlock (one of the two aborted).
# - a complete or a dead-letter of a todo others wait for (has_dependents: a fan-in, a parent waiting for its
#   children) settles them (_SETTLED), the parent among them: the root and the parent, so that it never holds
#   the child while waiting for a parent that a cascading cancel holds while waiting for the child.
# Not ordered by this: deeper ancestors waiting for a grandchild, and a dependent outside the todo's ancestors
# (a sibling), which a cascade locks in its walk's order.
def ancestors_first(row: str, when: str, parent_when: str = "false") -> str:
    """SQL for the WHERE of an UPDATE of todos_todo whose row is ``row`` (its alias, or todos_todo): true, having
    locked the row's root when ``when`` holds (SQL on ``row``), and its parent too when ``parent_when`` does."""
    return f"""({row}.root_id IS NULL OR NOT ({when}) OR (SELECT count(*) FROM (
        SELECT FROM todos_todo a
        WHERE a.id = ANY(ARRAY[{row}.root_id, CASE WHEN {parent_when} THEN {row}.parent_id END])
        ORDER BY a.depth NULLS FIRST, a.id FOR NO KEY UPDATE OF a) ancestors) >= 0)"""


# The CTE that rolls a child's reported usage up to its root, in the same statement (after ``changed``, the
# child as updated under its receipt): the root's tree_usage and budget_exhausted. Lock order: the root
# (ancestors_first), then the child (its UPDATE); this UPDATE re-reads the root's latest version, so concurrent
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

# set_budget, after SET_BUDGET in its transaction (a new statement: its snapshot sees every child created before
# SET_BUDGET locked the root; a create after it reads the budget from the root it locks, sql.SPAWN): the
# tree's rows not marked yet -> budget_exhausted false, so the claim's budget predicate probes their root
# (BUDGET_OPEN). Only a tree whose root had no budget has any. Finished rows too (an operator may retry a
# dead-letter). Index: todo_tree (root_id, depth, id). Locks: the rows marked, in depth order (ancestors first,
# a tree's lock order: a finishing parent with children: "cancel" then locks below it, never above).
MARK_BUDGETED = """
UPDATE todos_todo t SET budget_exhausted = false
WHERE t.id IN (SELECT c.id FROM todos_todo c WHERE c.root_id = %(id)s AND c.budget_exhausted IS NULL
               ORDER BY c.depth, c.id FOR NO KEY UPDATE)
  AND t.budget_exhausted IS NULL
RETURNING t.id
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
    "CASCADE",
    "CASCADES_LEFT",
    "LATE_RESULT",
    "MARK_BUDGETED",
    "ORPHANS",
    "RECENT_USAGE",
    "ROLLED_UP",
    "SET_BUDGET",
    "TREE_BLOCKED",
    "USAGE_SET",
    "ancestors_first",
    "exhausted",
]
