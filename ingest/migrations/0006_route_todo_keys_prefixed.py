"""Route todos are now keyed ``ingest:<delivery id>:<route id>`` (a prefix agents may not send: issue 28,
security-review L3). A redelivery never re-runs the routes (the events table's (source, delivery_id)
decides it), but a replay of an event routed before this change does: it must find that event's todo
that can still run under the new key, so those keys are rewritten. Only runnable todos hold a key; the
finished ones keep theirs as history. A squatter's todo already holding the new key in the same queue
keeps it, and the route's todo keeps the old one: the unique index allows only one (the replay then
finds the squatter's, as it would have before)."""

from django.db import migrations

# The runnable predicate (todos/states.py RUNNABLE) as of this migration, written out: migrations are
# history and must not follow later changes of the code.
RUNNABLE = "({t}.state IN ('pending', 'claimed', 'scheduled', 'waiting') OR ({t}.state = 'failed' AND {t}.next_retry_at IS NOT NULL))"

PREFIX_ROUTE_KEYS = f"""
UPDATE todos_todo t
SET idempotency_key = 'ingest:' || t.idempotency_key
WHERE t.event_id IS NOT NULL
  AND t.idempotency_key IS NOT NULL
  AND t.idempotency_key NOT LIKE 'ingest:%'
  AND {RUNNABLE.format(t="t")}
  AND NOT EXISTS (
    SELECT 1 FROM todos_todo o
    WHERE o.queue = t.queue AND o.idempotency_key = 'ingest:' || t.idempotency_key AND {RUNNABLE.format(t="o")}
  )
"""

UNPREFIX_ROUTE_KEYS = f"""
UPDATE todos_todo t
SET idempotency_key = substr(t.idempotency_key, 8)
WHERE t.event_id IS NOT NULL
  AND t.idempotency_key LIKE 'ingest:%'
  AND {RUNNABLE.format(t="t")}
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0005_route_fair_key_template"),
        ("todos", "0021_register_queues_per_statement"),
    ]

    operations = [migrations.RunSQL(PREFIX_ROUTE_KEYS, UNPREFIX_ROUTE_KEYS, elidable=True)]
