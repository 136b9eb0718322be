"""Issue 31: fair claims take turns on their queue's row, and read the queue's most urgent pending todo with a
fresh snapshot after taking it (todos_fair_head, its text in todos/sql/functions/)."""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0028_people_waits")]

    operations = [
        migrations.RunSQL(migrations.RunSQL.noop, "DROP FUNCTION IF EXISTS todos_fair_head(text, text)"),
        functions.load("todos_fair_head"),
    ]
