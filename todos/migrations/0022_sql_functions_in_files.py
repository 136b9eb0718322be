"""Every SQL function and trigger of the todos schema from its file in todos/sql/functions/ (issue 34).

The texts are those 0009-0021 left in the database, unchanged; from here on a change edits the file and a
migration loads it by name.
"""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0021_register_queues_per_statement")]

    # The functions of that time, by name: a later file (0027's trigger) may name columns added after 0022.
    operations = [
        functions.load(
            "todos_fair_key_pending",
            "todos_fair_live_leases",
            "todos_fair_lock_key",
            "todos_fair_walk",
            "todos_live_leases",
            "todos_pending_fair_key",
            "todos_register_fair_key",
            "todos_register_inserted_queues",
            "todos_register_queue",
            "todos_settle_dependents",
        )
    ]
