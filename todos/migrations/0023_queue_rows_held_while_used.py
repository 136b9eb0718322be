"""The queue registry's triggers hold the queue rows they rely on (issue 28, M4: retention prunes queues).

`manage.py purge` now deletes todos_queue rows of queues left empty and never configured (todos/retention.py).
A create into an existing queue registers nothing: its trigger finds the row and moves on. Had it only read
the row, a purge could delete it meanwhile (it cannot see the create's uncommitted todo), leaving a todo
whose queue no claim expands to. So the triggers now take FOR KEY SHARE on the rows of the queues they write
to, as a foreign key's check does, until the create commits: the purge locks with SKIP LOCKED and passes a
held row over. A purge that locked the row first makes the trigger wait; after the wait the row is gone,
and the trigger's next statement (a fresh snapshot) registers the queue again. FOR KEY SHARE conflicts with
neither the claim's nor the controls' updates of a queue row (they change no key), only with its delete.

The two functions' texts are their files in todos/sql/functions/.
"""

from django.db import migrations

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0022_sql_functions_in_files")]

    operations = [functions.load("todos_register_inserted_queues", "todos_register_queue")]
