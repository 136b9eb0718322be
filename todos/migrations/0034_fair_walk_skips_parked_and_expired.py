"""Issue 31: the fair walk and the fair head pass over pending todos past their start-by deadline or held by a
parked limit of their own, so a key waiting on a quota wall never wins a walk (texts in todos/sql/functions/)."""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0033_limits_on_schedules_and_routes")]

    operations = [functions.load("todos_fair_head", "todos_fair_walk")]
