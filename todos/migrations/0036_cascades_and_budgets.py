"""Agent trees, issue 30 items 3-5: cascading cancel (children, cascade, revoked_lease_id, late_result, index
todo_cascade_pending, todos_cascade and the trigger of children: "cancel") and budgets (usage, tree_usage,
budget, budget_exhausted, todos_usage_add). Every column is nullable with no default: adding them rewrites
nothing. The functions' texts are their files in todos/sql/functions/.
"""

from django.db import migrations, models

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [
        ("events", "0003_event_body_sha256"),
        ("todos", "0035_event_subscriptions"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="budget",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="budget_exhausted",
            field=models.BooleanField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="cascade",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="children",
            field=models.CharField(blank=True, editable=False, max_length=6, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="late_result",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="revoked_lease_id",
            field=models.CharField(blank=True, editable=False, max_length=40, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="tree_usage",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="usage",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("cascade__isnull", False)), fields=["id"], name="todo_cascade_pending"
            ),
        ),
        functions.load("todos_usage_add", "todos_cascade", "todos_children_cancel"),
    ]
