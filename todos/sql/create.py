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
# A child's lineage (parent_id, root_id, depth) comes as three more keys of its item, set by create_many
# after SPAWN below; a root's item has none of them, so the columns stay NULL: a plain create writes nothing
# more than before, and no entry in the lineage indexes (todo_children, todo_tree are partial).
# An item's run_at: its own, or NULL for now() + its delay seconds (NULL: none); in the future it is scheduled.
_ITEM_RUN_AT = "COALESCE(i.run_at, now() + make_interval(secs => COALESCE(i.delay, 0)))"
_ITEM_COLUMNS = """id text, queue text, source text, kind text, title text, payload json, event_id text,
    idempotency_key text, assignee text, max_attempts integer, run_at timestamptz, delay double precision,
    priority smallint, depends_on text[], on_dependency_failure text, has_dependents boolean, waiting_for json,
    traceparent text, fair_key text, parent_id text, root_id text, depth smallint, spawn_caps json, callback json,
    limits text[], expires_at timestamptz, expire_after double precision, children text, budget json"""
_ITEM_NAMES = ", ".join(c.split()[0] for c in _ITEM_COLUMNS.split(","))


def _create_many(returning: str, answer: str) -> str:
    return f"""
WITH inserted AS (
INSERT INTO todos_todo (id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
    state, attempt, max_attempts, errors, created_at, updated_at, run_at, priority,
    depends_on, dependencies_left, on_dependency_failure, has_dependents, waiting_for, traceparent, fair_key,
    parent_id, root_id, depth, spawn_caps, callback, limits, expires_at, children, budget)
SELECT i.id, i.queue, COALESCE(i.source, ''), COALESCE(i.kind, ''), COALESCE(i.title, ''),
    COALESCE(i.payload::jsonb, '{{}}'::jsonb), i.event_id, i.idempotency_key, i.assignee,
    CASE WHEN i.depends_on IS NOT NULL THEN '{S.TodoState.WAITING}'
         WHEN {_ITEM_RUN_AT} > now() THEN '{S.TodoState.SCHEDULED}' ELSE '{S.TodoState.PENDING}' END,
    0, COALESCE(i.max_attempts, %(max_attempts)s), '[]'::jsonb, now(), now(), {_ITEM_RUN_AT}, COALESCE(i.priority, 0),
    i.depends_on, COALESCE(cardinality(i.depends_on), 0),
    COALESCE(i.on_dependency_failure, %(on_dependency_failure)s),
    COALESCE(i.has_dependents, false), i.waiting_for::jsonb, i.traceparent, COALESCE(i.fair_key, ''),
    i.parent_id, i.root_id, i.depth, i.spawn_caps::jsonb, i.callback::jsonb, i.limits,
    COALESCE(i.expires_at, now() + make_interval(secs => i.expire_after)), i.children, i.budget::jsonb
FROM ROWS FROM (json_to_recordset(%(items)s::json) AS ({_ITEM_COLUMNS}))
    WITH ORDINALITY AS i({_ITEM_NAMES}, ord)
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
SELECT {answer} FROM inserted CROSS JOIN (SELECT count(*) FROM notified) n
"""


# What a batch answers per item (todos/api/serializers.py batch_outcomes), and what create_many needs to
# match items to rows: a thousand whole todos would cost more to read and build than to insert.
BRIEF_COLUMNS = "id, queue, idempotency_key, state"
# create: the whole todo.
CREATE_MANY = _create_many(_TODO_COLUMNS, "inserted.*")
# create_many: each item's BRIEF_COLUMNS (queue, state and run_at also feed the NOTIFY).
CREATE_MANY_BRIEF = _create_many(f"{BRIEF_COLUMNS}, run_at", BRIEF_COLUMNS)

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


# A create with a parent (todos/queue/create.py, _spawn): its first statement, in the create's transaction.
# Guard: the caller holds the parent's current receipt (_HOLDS_RECEIPT: id, lease, owner agent, a queue it
# may see); lock: the parent row, FOR NO KEY UPDATE, until the create commits (index: the primary key). While
# it is held the parent cannot be completed, failed, released, cancelled or claimed again, so the receipt
# stays current until the children are inserted (no read-then-write race with the lease), and two creates
# under one parent take turns: the next one's SPAWN_CAPS (a new statement, so a fresh snapshot) sees the
# children the first inserted. No row: a stale or foreign receipt, nothing is created.
LOCK_PARENT = f"""
SELECT id, COALESCE(root_id, id), COALESCE(depth, 0) + 1 FROM todos_todo
WHERE {_HOLDS_RECEIPT}
FOR NO KEY UPDATE
"""

# Then, with the parent locked: the spawn caps of the tree (each the smaller of its root's queue's, todos_queue,
# and the root's own spawn_caps given at its create; LEAST skips a NULL), decided
# and counted in one statement. max_depth: the children's depth. max_children: the parent's unfinished
# children (todo_children, counted only when the queue has the cap, up to the cap: a bounded probe) plus the
# %(n)s::int new ones; the parent's lock makes the count current, since every create under it takes turns.
# max_descendants: the root's counter (todos_todo.descendants), raised by %(n)s::int in this statement under the
# root row's lock (UPDATE; a create under another parent of the same tree waits for it, and its guard is
# re-checked on the row as the first one committed it), so concurrent creators never pass the cap together.
# Lock order: the parent (LOCK_PARENT), then the root; nothing locks a root and then a todo below it.
# Answers the cap refused ('max_depth', 'max_children', 'max_descendants') or NULL, and the cap's value.
SPAWN_CAPS = f"""
WITH root AS (
    SELECT r.id, COALESCE(r.descendants, 0) AS descendants,
        LEAST(q.max_depth, (r.spawn_caps->>'max_depth')::integer) AS max_depth,
        LEAST(q.max_children, (r.spawn_caps->>'max_children')::integer) AS max_children,
        LEAST(q.max_descendants, (r.spawn_caps->>'max_descendants')::integer) AS max_descendants
    FROM todos_todo r LEFT JOIN todos_queue q ON q.name = r.queue
    WHERE r.id = %(root)s::text
),
verdict AS (
    SELECT root.id, CASE
        WHEN max_depth IS NOT NULL AND %(depth)s::int > max_depth THEN 'max_depth'
        WHEN max_children IS NOT NULL AND %(n)s::int + (
            SELECT count(*) FROM (SELECT FROM todos_todo c WHERE c.parent_id = %(parent)s::text
                                  AND NOT ({S.FINISHED.sql("c")}) LIMIT max_children) live
        ) > max_children THEN 'max_children'
        END AS cap,
        max_depth, max_children, max_descendants
    FROM root
),
counted AS (
    UPDATE todos_todo r SET descendants = COALESCE(r.descendants, 0) + %(n)s::int
    FROM verdict
    WHERE r.id = verdict.id AND verdict.cap IS NULL
      AND (verdict.max_descendants IS NULL OR COALESCE(r.descendants, 0) + %(n)s::int <= verdict.max_descendants)
    RETURNING r.id
)
SELECT COALESCE(verdict.cap, CASE WHEN NOT EXISTS (SELECT FROM counted) THEN 'max_descendants' END),
    max_depth, max_children, max_descendants
FROM verdict
"""

# The items of a create with a parent that did not insert (their idempotency key was held): the root's
# counter gives them back, under the lock SPAWN_CAPS took, so a repeated create does not use up the tree.
UNCOUNT_DESCENDANTS = """
UPDATE todos_todo SET descendants = descendants - %(n)s::int WHERE id = %(root)s::text RETURNING descendants
"""
