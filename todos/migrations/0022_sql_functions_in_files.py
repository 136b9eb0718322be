"""Every SQL function and trigger of the todos schema from its file in todos/sql/functions/ (issue 34).

The texts are those 0009-0021 left in the database, unchanged; from here on a change edits the file and a
migration loads it by name.
"""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0021_register_queues_per_statement")]

    operations = [functions.load(*functions.names())]
