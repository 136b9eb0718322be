"""Issue 28 (H2): an event wait names a source its waiter can see. Waits opened before that rule may still
name a source no route of which reaches their waiter's scopes, and would receive its next delivery's whole
payload. This ends each of them: its event key goes (no delivery can find it: RESOLVE_EVENTS probes by key)
and its timeout is brought forward, so the reaper's next sweep times it out as any wait (pending with
resolution.timed_out, or a counted failure for on_timeout "fail"). A wait whose waiter is no longer an
active agent ends too. The scope rule is ingest's visible_to (ingest/routing.py), written here in SQL: a
route of the source, active or not, whose queue matches one of the agent's claim or create scopes
(glob_to_like, in SQL).

It lives in ingest because it reads ingest's routes and todos' waits: todos may not know ingest.
"""

from django.db import migrations

# glob_to_like (todos/models.py) in SQL: escape \ % _, then * -> %, ? -> _.
_LIKE = r"""replace(replace(replace(replace(replace(p.scope, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_')"""

END_UNSEEN_EVENT_WAITS = f"""
UPDATE todos_waitpoint w SET event_key = NULL, timeout_at = LEAST(w.timeout_at, now())
WHERE w.resolved_at IS NULL AND w.event_source IS NOT NULL
  AND NOT EXISTS (
    SELECT 1 FROM todos_agent a
    JOIN ingest_source s ON s.slug = w.event_source
    JOIN ingest_route r ON r.source_id = s.id
    WHERE a.name = w.waiter AND a.is_active
      AND r.queue LIKE ANY (SELECT {_LIKE} FROM unnest(a.claim_scopes || a.create_scopes) AS p(scope))
  )
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0006_route_todo_keys_prefixed"),
        ("todos", "0025_waitpoint_waiter_and_resolvers"),
    ]

    operations = [migrations.RunSQL(END_UNSEEN_EVENT_WAITS, migrations.RunSQL.noop)]
