"""Issue 31's cost bar: the fair claim scans a key's pending todos from the first one pending now, read with a
fresh snapshot (todos_fair_key_first), not from the key's head in the claim's older snapshot (texts in
todos/sql/functions/; docs/benchmarks.md)."""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0039_fair_walk_row_estimates")]

    operations = [functions.load("todos_fair_key_first")]
