"""Dependencies (issue 20).

A dependent waits (state waiting, dependencies_left > 0) for the todos it names; an edge (todos_dependency)
records each. Whatever statement finishes a todo (complete, fail at the cap, the reaper at the cap, cancel,
discard) settles its dependents in the same statement (_SETTLED, in _finishing), through the VOLATILE function
todos_settle_dependents (migrations 0017, 0020): done counts a dependency off; a dead-letter or a cancel
applies the dependent's on_dependency_failure (cancel, or count it off); the last one moves it to pending (or
scheduled, its run_at ahead), with a NOTIFY. A dependent cancelled that way settles its own dependents in the
same call. A holder's wait on todos makes the same edges, marked wait (todos/sql/waits.py, LINK_WAIT): every
outcome counts off, and the last one resolves the wait. Why a function: its statements take fresh snapshots. A
create that links a dependency locks that row (LINK); a statement finishing it meanwhile waits for the lock,
and its own snapshot, taken before the wait, would miss the new edges and dependent; the function's does not.
"""

from todos import states as S
from todos.sql.common import _OUTCOME, _TODO_COLUMNS
from todos.sql.create import BRIEF_COLUMNS

# link (create, for the items that name dependencies): the edges, and has_dependents on each dependency.
# Guard: each dependency is visible to the creator (the ids that do not come back are refused: 404, and
# the transaction rolls back); lock: each dependency row FOR NO KEY UPDATE, in id order (two creates naming
# the same todos cannot deadlock), held to commit, so a statement finishing one of them either finished
# it before (it comes back finished here, and SETTLE settles the new edges) or waits, then sees the flag
# and the committed edges (todos_settle_dependents); index: the primary key. A flag already set is not
# written again. Returns each dependency found, with its outcome (NULL: not finished).
LINK = f"""
WITH edges AS (
    SELECT * FROM unnest(%(dependents)s::text[], %(positions)s::integer[], %(dependencies)s::text[])
        AS e(dependent_id, position, dependency_id)
),
locked AS MATERIALIZED (
    SELECT t.id, t.has_dependents, {_OUTCOME} AS outcome FROM todos_todo t
    WHERE t.id IN (SELECT dependency_id FROM edges) AND t.queue LIKE ANY(%(visible)s::text[])
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
),
flagged AS (
    UPDATE todos_todo t SET has_dependents = true FROM locked WHERE t.id = locked.id AND NOT locked.has_dependents
),
linked AS (
    INSERT INTO todos_dependency (dependency_id, dependent_id, position)
    SELECT dependency_id, dependent_id, position FROM edges WHERE dependency_id IN (SELECT id FROM locked)
)
SELECT id, outcome FROM locked
"""

# settle (create, and a wait on todos): the todos LINK or LINK_WAIT found finished already, settled at once
# for the new edges.
SETTLE = "SELECT todos_settle_dependents(%(ids)s::text[], %(outcomes)s::text[])"

# The todos just created, as they are after SETTLE moved some of them on.
TODOS_BY_ID = f"SELECT {_TODO_COLUMNS} FROM todos_todo WHERE id = ANY(%(ids)s::text[])"
# The same, as a batch create answers them (todos/sql/create.py BRIEF_COLUMNS).
REFS_BY_ID = f"SELECT {BRIEF_COLUMNS} FROM todos_todo WHERE id = ANY(%(ids)s::text[])"

# repoint (create, rare): an item of a batch named by another's depends_on_index turned out to be an
# existing todo (idempotency); the dependents' waiting_for names that todo instead. Own rows, just inserted.
REPOINT = """
UPDATE todos_todo t
SET waiting_for = v.waiting_for, depends_on = ARRAY(SELECT jsonb_array_elements_text(v.waiting_for -> 'todos'))
FROM unnest(%(ids)s::text[], %(waiting_fors)s::jsonb[]) AS v(id, waiting_for)
WHERE t.id = v.id
RETURNING t.id
"""

# A todo's dependencies for its JSON (todos/api/serializers.py): the first %(limit)s of its depends_on, each
# with its state and its result's size (the JSON's budget), in order. Index: the todos' primary key. A
# dependency retention removed comes back with a NULL state.
DEPENDENCIES_OF = f"""
SELECT p.id, d.id, t.state, {S.DEAD_LETTER.sql("t")}, t.result, octet_length(t.result::text)
FROM todos_todo p CROSS JOIN LATERAL unnest(p.depends_on[1:%(limit)s]) WITH ORDINALITY AS d(id, ord)
LEFT JOIN todos_todo t ON t.id = d.id
WHERE p.id = ANY(%(ids)s::text[])
ORDER BY p.id, d.ord
"""
