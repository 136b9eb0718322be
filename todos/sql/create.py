"""create: new todos (pending, or scheduled when run_at is ahead) and the runnable todo holding an
idempotency key.
"""

from todos import states as S
from todos.sql.common import _TODO_COLUMNS, NOTIFY_CHANNEL

# A scheduled create wakes the long-polls of its queue only when it falls due within the longest wait
# (todos/api/serializers.py MAX_WAIT_SECONDS): a waiter then re-reads its next wake time
# (todos/selectors.py seconds_until_claimable) and wakes at run_at. Later ones are found by the waits
# that start after them; NOTIFYing those would wake waiters for nothing.
SCHEDULED_NOTIFY_HORIZON_SECONDS = 20

# Also the unique constraint todo_runnable_idempotency_key's condition (todos/models.py); ON CONFLICT
# must repeat it for PostgreSQL to pick that partial index as the arbiter.
_RUNNABLE_KEY = f"idempotency_key IS NOT NULL AND {S.RUNNABLE.sql()}"


# create (one todo or a batch of up to 1,000, todos/queue.py create_many): each item -> pending, -> scheduled
# when its run_at is in the future, or -> waiting when it names dependencies (LINK and SETTLE below then
# settle those already finished). One INSERT ... SELECT FROM unnest(one array per column), not a statement
# per item. A row comes back only for the items inserted; a missing one means a runnable todo with the same
# (queue, idempotency_key) exists, perhaps an earlier item of the same batch (read them with
# RUNNABLE_BY_KEYS). Guard: the unique index todo_runnable_idempotency_key (ON CONFLICT, first item wins);
# lock: the rows inserted. The queue's name is registered by the todo table's trigger (migration 0009), in
# the same statement, whatever path writes the row. Notifies the queues of what is claimable now or soon.
# An item's run_at: its own, or NULL for now() + its delay seconds (NULL: none); in the future it is scheduled.
_ITEM_RUN_AT = "COALESCE(i.run_at, now() + make_interval(secs => COALESCE(i.delay, 0)))"
CREATE_MANY = f"""
WITH inserted AS (
INSERT INTO todos_todo (id, queue, source, kind, title, payload, event_id, idempotency_key, assignee,
    state, attempt, max_attempts, errors, created_at, updated_at, run_at, priority,
    depends_on, dependencies_left, on_dependency_failure, has_dependents, waiting_for, traceparent, fair_key)
SELECT i.id, i.queue, i.source, i.kind, i.title, i.payload, i.event_id, i.idempotency_key, i.assignee,
    CASE WHEN i.dependency_count > 0 THEN '{S.TodoState.WAITING}'
         WHEN {_ITEM_RUN_AT} > now() THEN '{S.TodoState.SCHEDULED}' ELSE '{S.TodoState.PENDING}' END,
    0, i.max_attempts, '[]'::jsonb, now(), now(), {_ITEM_RUN_AT}, i.priority,
    CASE WHEN i.waiting_for IS NOT NULL THEN ARRAY(SELECT jsonb_array_elements_text(i.waiting_for -> 'todos')) END,
    i.dependency_count, i.on_dependency_failure,
    i.has_dependents, i.waiting_for, i.traceparent, i.fair_key
FROM unnest(%(ids)s::text[], %(queues)s::text[], %(sources)s::text[], %(kinds)s::text[], %(titles)s::text[],
    %(payloads)s::jsonb[], %(event_ids)s::text[], %(keys)s::text[], %(assignees)s::text[], %(max_attempts)s::integer[],
    %(run_ats)s::timestamptz[], %(delays)s::double precision[], %(priorities)s::smallint[],
    %(dependency_counts)s::integer[], %(policies)s::text[], %(targets)s::boolean[], %(waiting_fors)s::jsonb[],
    %(traceparents)s::text[], %(fair_keys)s::text[])
    WITH ORDINALITY AS i(id, queue, source, kind, title, payload, event_id, idempotency_key, assignee, max_attempts,
        run_at, delay, priority, dependency_count, on_dependency_failure, has_dependents, waiting_for,
        traceparent, fair_key, ord)
ORDER BY i.ord
ON CONFLICT (queue, idempotency_key) WHERE {_RUNNABLE_KEY} DO NOTHING
RETURNING {_TODO_COLUMNS}
),
notified AS MATERIALIZED (
    SELECT pg_notify('{NOTIFY_CHANNEL}', CASE WHEN n > 1 THEN queue || ' ' || n ELSE queue END)
    FROM (SELECT queue, count(*) AS n FROM inserted
          WHERE {S.PENDING.sql()} OR ({S.SCHEDULED.sql()}
              AND run_at <= now() + make_interval(secs => {SCHEDULED_NOTIFY_HORIZON_SECONDS}))
          GROUP BY queue) q
)
SELECT inserted.* FROM inserted CROSS JOIN (SELECT count(*) FROM notified) n
"""

# The items of a batch that did not insert: the runnable todos holding their keys.
RUNNABLE_BY_KEYS = f"""
SELECT {_TODO_COLUMNS} FROM todos_todo
WHERE (queue, idempotency_key) IN (SELECT * FROM unnest(%(queues)s::text[], %(keys)s::text[]))
  AND {_RUNNABLE_KEY}
"""
