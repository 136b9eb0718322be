"""create: new todos (pending, or scheduled when run_at is ahead) and the runnable todo holding an
idempotency key.
"""

from todos import states as S
from todos.sql.common import _HOLDS_RECEIPT, _TODO_COLUMNS, NOTIFY_CHANNEL

# A scheduled create wakes the long-polls of its queue only when it falls due within the longest wait
# (todos/api/serializers.py MAX_WAIT_SECONDS): a waiter then re-reads its next wake time
# (todos/selectors.py seconds_until_claimable) and wakes at run_at. Later ones are found by the waits
# that start after them; NOTIFYing those would wake waiters for nothing.
SCHEDULED_NOTIFY_HORIZON_SECONDS = 20

# Also the unique constraint todo_runnable_idempotency_key's condition (todos/models.py); ON CONFLICT
# must repeat it for PostgreSQL to pick that partial index as the arbiter.
_RUNNABLE_KEY = f"idempotency_key IS NOT NULL AND {S.RUNNABLE.sql()}"


# create (one todo or a batch of up to 1,000, todos/queue/ create_many): each item -> pending, -> scheduled
# when its run_at is in the future, or -> waiting when it names dependencies (LINK and SETTLE below then
# settle those already finished). One INSERT ... SELECT FROM the items, not a statement per item. The items
# come as one JSON array of objects, one text parameter: per-column arrays cost psycopg a Python call per
# element, about 35 ms a batch of 1,000, where json.dumps and json_to_recordset take about 5 ms
# (docs/benchmarks.md, "Batch create"). A key left out is NULL, and the column's default is filled in here
# (max_attempts' and on_dependency_failure's are parameters); payload and waiting_for arrive as json and are
# stored as jsonb. A row comes back only for the items inserted; a missing one means a runnable todo with the
# same (queue, idempotency_key) exists, perhaps an earlier item of the same batch (read them with
# RUNNABLE_BY_KEYS). Guard: the unique index todo_runnable_idempotency_key (ON CONFLICT, first item wins);
# lock: the rows inserted, in (queue, idempotency_key) order: an INSERT meeting a key another transaction
# inserted uncommitted waits for it, and two batches naming the same keys in other orders would otherwise
# each wait for the other (a deadlock). Items with one key keep their order: the first wins. The queue's
# name is registered by the todo table's trigger (migrations 0009 and 0021: once per statement, per distinct
# queue), in the same statement, whatever path writes the row. Notifies the queues of what is claimable now
# or soon.
# A child's lineage (parent_id, root_id, depth) comes from SPAWN's verdict (below), in the same statement; a
# root's columns stay NULL: a plain create writes nothing more than before, and no entry in the lineage
# indexes (todo_children, todo_tree are partial).
# An item's run_at: its own, or NULL for now() + its delay seconds (NULL: none); in the future it is scheduled.
_ITEM_RUN_AT = "COALESCE(i.run_at, now() + make_interval(secs => COALESCE(i.delay, 0)))"
_ITEM_COLUMNS = """id text, queue text, source text, kind text, title text, payload json, event_id text,
    idempotency_key text, assignee text, max_attempts integer, run_at timestamptz, delay double precision,
    priority smallint, depends_on text[], on_dependency_failure text, has_dependents boolean, waiting_for json,
    traceparent text, fair_key text, parent_id text, root_id text, depth smallint, spawn_caps json, callback json,
    limits text[], expires_at timestamptz, expire_after double precision, children text, budget json"""
_ITEM_NAMES = ", ".join(c.split()[0] for c in _ITEM_COLUMNS.split(","))


# A create with a parent (issue 30; todos/queue/lineage.py), in ONE statement: the receipt, the spawn caps
# and the insert, the caps decided in the statement that inserts, never read-then-write.
#
# Lock order: a tree's, ancestors first (todos/sql/trees.py, ancestors_first). root_row locks the tree's root (FOR NO
# KEY UPDATE; index: the primary key, the root's id read from the parent's row) before held locks the parent (a WHERE
# that waits for root_row: an InitPlan run as the scan tests the parent's row, before LockRows locks it); the root is
# found from a parent row carrying the lease named (so a create naming a todo it does not hold locks no tree's root).
# Every create in a tree takes its root's lock until it commits, so creates in one tree take turns. Guard: the caller
# holds the parent's current receipt (_HOLDS_RECEIPT: id, lease, owner agent, a queue it may see), re-checked on the
# row's latest version as it is locked; held's lock keeps the receipt current (the parent cannot be completed, failed,
# released, cancelled or claimed again) until the children are inserted. No row: a stale or foreign receipt, nothing
# is created (ParentNotHeld).
#
# Caps, each the smaller of the root's queue's (todos_queue) and the root's own spawn_caps (LEAST skips a
# NULL), and MAX_TREE_DEPTH whatever they say:
# - max_depth: the children's depth.
# - max_descendants: the root's lifetime counter (descendants) as root_row locked it: its latest value, which
#   no other create can change before this one commits; counted raises it by the rows inserted (an item whose
#   idempotency key is held inserts nothing and is not counted).
# - max_children (live): the parent's unfinished children (todo_children, counted only when the cap is set,
#   up to the cap: a bounded probe) plus the %(n)s new ones. That count reads the statement's snapshot, taken
#   before root_row's lock was granted: a create of this tree that committed in between would be missed. Such a
#   create raised the root's descendants, so the snapshot's counter differs from the locked one's: the verdict
#   is then 'stale', nothing is written, and the caller runs the statement again after LOCK_ROOT (a fresh
#   snapshot, taken with the root already locked). Without a max_children cap nothing is ever stale.
# A root gone (retention purged it, finished, while its tree lived on) leaves only MAX_TREE_DEPTH to apply.
# A child of a root with a budget (read from root_row: its latest version, which set_budget cannot change
# before this create commits) is marked budget_exhausted false: the claim's budget predicate probes its root
# (todos/sql/trees.py, BUDGET_OPEN); any other child keeps NULL, and its claim reads no root.
# Answers (cap, value, the todo's columns): one row per todo inserted with cap NULL; or one row with the
# cap refused ('max_depth', 'max_children', 'max_descendants', or 'stale') and its value, and NULL columns
# (also when every item's key was held: then the caller reads the holders).
_SPAWN_VERDICT = f"""root_row AS MATERIALIZED (
    SELECT r.id, COALESCE(r.descendants, 0) AS descendants, r.queue, r.spawn_caps, r.budget FROM todos_todo r
    WHERE r.id = (SELECT COALESCE(p.root_id, p.id) FROM todos_todo p WHERE p.id = %(id)s AND p.lease_id = %(lease_id)s)
    FOR NO KEY UPDATE
),
held AS MATERIALIZED (
    SELECT id AS parent_id, COALESCE(root_id, id) AS root_id, COALESCE(depth, 0) + 1 AS depth FROM todos_todo
    WHERE {_HOLDS_RECEIPT} AND (SELECT count(*) FROM root_row) >= 0
    FOR NO KEY UPDATE
),
caps AS MATERIALIZED (
    SELECT h.*, rr.id AS root_found, rr.descendants, CASE WHEN rr.budget IS NOT NULL THEN false END AS budgeted,
        LEAST(q.max_depth, (rr.spawn_caps->>'max_depth')::integer) AS max_depth,
        LEAST(q.max_children, (rr.spawn_caps->>'max_children')::integer) AS max_children,
        LEAST(q.max_descendants, (rr.spawn_caps->>'max_descendants')::integer) AS max_descendants
    FROM held h LEFT JOIN root_row rr ON rr.id = h.root_id LEFT JOIN todos_queue q ON q.name = rr.queue
),
verdict AS MATERIALIZED (
    SELECT c.parent_id, c.root_id, c.depth, c.budgeted, CASE
        WHEN c.depth > %(max_tree_depth)s::int THEN 'max_depth'
        WHEN c.max_depth IS NOT NULL AND c.depth > c.max_depth THEN 'max_depth'
        WHEN c.max_children IS NOT NULL AND c.descendants
            IS DISTINCT FROM (SELECT COALESCE(s.descendants, 0) FROM todos_todo s WHERE s.id = c.root_found)
            THEN 'stale'
        WHEN c.max_children IS NOT NULL AND %(n)s::int + (
            SELECT count(*) FROM (SELECT FROM todos_todo k WHERE k.parent_id = c.parent_id
                                  AND NOT ({S.FINISHED.sql("k")}) LIMIT c.max_children) live
        ) > c.max_children THEN 'max_children'
        WHEN c.max_descendants IS NOT NULL AND c.descendants + %(n)s::int > c.max_descendants THEN 'max_descendants'
        END AS cap,
        c.max_depth, c.max_children, c.max_descendants
    FROM caps c
),
"""
_ANSWER = "SELECT {} FROM inserted CROSS JOIN (SELECT count(*) FROM notified) n"
_SPAWN_ANSWER = """,
counted AS (
    UPDATE todos_todo r SET descendants = COALESCE(r.descendants, 0) + (SELECT count(*) FROM inserted)
    FROM verdict v WHERE r.id = v.root_id AND v.cap IS NULL AND EXISTS (SELECT FROM inserted)
    RETURNING r.id
)
SELECT v.cap, CASE v.cap WHEN 'max_depth' THEN LEAST(v.max_depth, %(max_tree_depth)s::int)
        WHEN 'max_children' THEN v.max_children WHEN 'max_descendants' THEN v.max_descendants END,
    {}
FROM verdict v LEFT JOIN inserted ON true
    CROSS JOIN (SELECT count(*) FROM notified) n CROSS JOIN (SELECT count(*) FROM counted) c"""

# The stale verdict's second try (and a create with a parent that needs a transaction: dependencies, new
# queues): in the create's transaction, the tree's root locked first (as SPAWN's root_row), so SPAWN's next
# snapshot is taken with it held and sees every create of the tree that went before.
LOCK_ROOT = """
SELECT r.id FROM todos_todo r
WHERE r.id = (SELECT COALESCE(p.root_id, p.id) FROM todos_todo p WHERE p.id = %(id)s AND p.lease_id = %(lease_id)s)
FOR NO KEY UPDATE
"""


def _create_many(returning: str, answer: str, *, spawn: bool = False) -> str:
    lineage = "v.parent_id, v.root_id, v.depth" if spawn else "i.parent_id, i.root_id, i.depth"
    budgeted_column, budgeted = (", budget_exhausted", ", v.budgeted") if spawn else ("", "")
    items = f"""ROWS FROM (json_to_recordset(%(items)s::json) AS ({_ITEM_COLUMNS}))
    WITH ORDINALITY AS i({_ITEM_NAMES}, ord)"""
    if spawn:  # the verdict: one row, whose cap is NULL when every cap passed (SPAWN below)
        items += "\n    JOIN verdict v ON v.cap IS NULL"
    return f"""
WITH {_SPAWN_VERDICT if spawn else ""}inserted AS (
INSERT INTO todos_todo (id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
    state, attempt, max_attempts, errors, created_at, updated_at, run_at, priority,
    depends_on, dependencies_left, on_dependency_failure, has_dependents, waiting_for, traceparent, fair_key,
    parent_id, root_id, depth, spawn_caps, callback, limits, expires_at, children, budget{budgeted_column})
SELECT i.id, i.queue, COALESCE(i.source, ''), COALESCE(i.kind, ''), COALESCE(i.title, ''),
    COALESCE(i.payload::jsonb, '{{}}'::jsonb), i.event_id, i.idempotency_key, i.assignee,
    CASE WHEN i.depends_on IS NOT NULL THEN '{S.TodoState.WAITING}'
         WHEN {_ITEM_RUN_AT} > now() THEN '{S.TodoState.SCHEDULED}' ELSE '{S.TodoState.PENDING}' END,
    0, COALESCE(i.max_attempts, %(max_attempts)s), '[]'::jsonb, now(), now(), {_ITEM_RUN_AT}, COALESCE(i.priority, 0),
    i.depends_on, COALESCE(cardinality(i.depends_on), 0),
    COALESCE(i.on_dependency_failure, %(on_dependency_failure)s),
    COALESCE(i.has_dependents, false), i.waiting_for::jsonb, i.traceparent, COALESCE(i.fair_key, ''),
    {lineage}, i.spawn_caps::jsonb, i.callback::jsonb, i.limits,
    COALESCE(i.expires_at, now() + make_interval(secs => i.expire_after)), i.children, i.budget::jsonb{budgeted}
FROM {items}
ORDER BY i.queue COLLATE "C", i.idempotency_key COLLATE "C", i.ord
ON CONFLICT (queue, idempotency_key) WHERE {_RUNNABLE_KEY} DO NOTHING
RETURNING {returning}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM inserted
          WHERE {S.PENDING.sql()} OR ({S.SCHEDULED.sql()}
              AND run_at <= now() + make_interval(secs => {SCHEDULED_NOTIFY_HORIZON_SECONDS}))
          GROUP BY queue) q
)
{_SPAWN_ANSWER.format(answer) if spawn else _ANSWER.format(answer)}
"""


# What a batch answers per item (todos/api/serializers.py batch_outcomes), and what create_many needs to
# match items to rows: a thousand whole todos would cost more to read and build than to insert.
BRIEF_COLUMNS = "id, queue, idempotency_key, state"
# create: the whole todo.
CREATE_MANY = _create_many(_TODO_COLUMNS, "inserted.*")
# create_many: each item's BRIEF_COLUMNS (queue, state and run_at also feed the NOTIFY).
CREATE_MANY_BRIEF = _create_many(f"{BRIEF_COLUMNS}, run_at", BRIEF_COLUMNS)
# The same under a parent (SPAWN above): create's and create_many's.
SPAWN = _create_many(_TODO_COLUMNS, "inserted.*", spawn=True)
SPAWN_BRIEF = _create_many(f"{BRIEF_COLUMNS}, run_at", BRIEF_COLUMNS.replace("id", "inserted.id", 1), spawn=True)

# The items of a batch that did not insert: the runnable todos holding their keys.
_RUNNABLE_BY_KEYS = f"""
SELECT {{}} FROM todos_todo
WHERE (queue, idempotency_key) IN (SELECT * FROM unnest(%(queues)s::text[], %(keys)s::text[]))
  AND {_RUNNABLE_KEY}
"""
RUNNABLE_BY_KEYS = _RUNNABLE_BY_KEYS.format(_TODO_COLUMNS)
RUNNABLE_BY_KEYS_BRIEF = _RUNNABLE_BY_KEYS.format(BRIEF_COLUMNS)

# The queues a create names that are not registered yet (todos_queue's primary key, one probe each; no lock):
# only an agent's create into a new queue under a glob scope goes on to ADMIT_NEW_QUEUES.
UNREGISTERED_QUEUES = """
SELECT n.name FROM unnest(%(names)s::text[]) AS n(name)
WHERE NOT EXISTS (SELECT FROM todos_queue q WHERE q.name = n.name)
"""

# Before an agent's create adds queues under its glob create scopes (todos/queue/new_queues.py, admit_new_queues): in
# the create's transaction, one transaction-level advisory lock per glob, in the globs' order (so two
# creates never wait for each other crosswise), held until the create commits. Two creates adding queues
# under the same glob therefore take turns, and the second one's next statement counts the first one's
# queues: the count and the insert are not a read-then-write race.
LOCK_CREATE_SCOPES = """
SELECT count(pg_advisory_xact_lock(hashtextextended('todos_queue_scope ' || g.glob, 0)))
FROM (SELECT glob FROM unnest(%(globs)s::text[]) AS s(glob) ORDER BY glob COLLATE "C") g
"""

# Then, with the locks held (a new statement, so a fresh snapshot): the names still unregistered, and per
# glob how many registered queues it covers, counted up to %(cap)s + 1 (todos_queue stays small: this
# limit bounds it), so the count stops early on a full scope.
ADMIT_NEW_QUEUES = """
SELECT
    ARRAY(SELECT n.name FROM unnest(%(names)s::text[]) AS n(name)
          WHERE NOT EXISTS (SELECT FROM todos_queue q WHERE q.name = n.name)),
    ARRAY(SELECT (SELECT count(*) FROM (SELECT FROM todos_queue q WHERE q.name LIKE s.pattern
                                       LIMIT %(cap)s + 1) c)
          FROM unnest(%(patterns)s::text[]) WITH ORDINALITY AS s(pattern, n) ORDER BY s.n)
"""
