"""Issue 31's cost bar: the fair walk and the fair key lock declare how many rows they return (ROWS 4, ROWS 1)
instead of PostgreSQL's default 1,000, so a busy key's backlog no longer multiplies the fair claim's estimated
cost by 1,000 (texts in todos/sql/functions/; docs/benchmarks.md)."""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0038_event_subscription_health")]

    operations = [functions.load("todos_fair_walk", "todos_fair_lock_key")]
