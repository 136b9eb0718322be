"""Issue 30, item 8: a child's budget_exhausted is the claim's marker (todos/sql/trees.py, BUDGET_OPEN): false
when its tree's root has a budget, NULL otherwise, and only a marked child's claim probes its root. Children
created before this marker existed are marked here, those of budgeted roots only (index todo_tree, children
only; the roots with a budget are few). A data change, no schema change."""

from django.db import migrations

MARK = """
UPDATE todos_todo c SET budget_exhausted = false
FROM todos_todo r
WHERE r.budget IS NOT NULL AND r.root_id IS NULL AND c.root_id = r.id AND c.budget_exhausted IS NULL
"""


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0038_event_subscription_health"),
    ]

    operations = [migrations.RunSQL(MARK, migrations.RunSQL.noop)]
