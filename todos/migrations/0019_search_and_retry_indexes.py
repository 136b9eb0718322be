"""Issue 24, items 13 and 14: indexes for reads that walked more than they needed.

* todo_dead_last_error (todos.models.last_error()) WHERE dead-letter: the admin's last-error filter (a
  triage group's list, and the every-matching actions on it), which read every dead-letter's errors.
* todo_admin_owner_recent (owner, created_at) WHERE owner IS NOT NULL: the admin's ``owner:NAME`` search,
  newest first (a sequential scan at 1M rows).
* todo_admin_key (idempotency_key) WHERE idempotency_key IS NOT NULL: the admin's ``key:K`` search of a
  todo in any state (todo_runnable_idempotency_key holds only the runnable ones, per queue).
* todo_retry_queue_due (queue, next_retry_at NULLS FIRST) WHERE retry-waiting: queue_stats()'s retry-waiting count
  and SECONDS_UNTIL_CLAIMABLE's next due retry, per queue (todo_retry_due has no queue, so both walked
  every queue's retries). todo_retry_due stays: the reaper promotes due retries across all queues in
  due order.

Built CONCURRENTLY, as in 0006 and 0014: creates and transitions keep running while they build.
docs/benchmarks.md ("Admin at 1M rows") and docs/query-plans.md have the measurements.
"""

import django.db.models.fields.json
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("todos", "0014_cancel_and_queue_controls"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                django.db.models.functions.text.Left(
                    django.db.models.fields.json.KeyTextTransform(
                        "error", django.db.models.fields.json.KeyTextTransform("-1", "errors")
                    ),
                    120,
                ),
                condition=models.Q(("next_retry_at__isnull", True), ("state", "failed")),
                name="todo_dead_last_error",
            ),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "created_at"],
                name="todo_admin_owner_recent",
            ),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=["idempotency_key"],
                name="todo_admin_key",
            ),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                models.F("queue"),
                models.OrderBy(models.F("next_retry_at"), nulls_first=True),
                condition=models.Q(("next_retry_at__isnull", False), ("state", "failed")),
                name="todo_retry_queue_due",
            ),
        ),
    ]
