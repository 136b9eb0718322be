"""Drop the two varchar_pattern_ops indexes Django adds beside a CharField key on PostgreSQL.

Django makes a "_like" index for every indexed CharField so that ``LIKE 'prefix%'`` can use an index.
Nothing here searches todo ids or event ids by prefix; equality uses the primary key and the plain
event_id index. Yet every claim, heartbeat and completion is a non-HOT update (state is in the partial
indexes' predicates), so each one wrote a new entry into both of these too: at 1M todos the id one alone
is 74 MB, as large as the primary key (docs/query-plans.md).
"""

from django.db import migrations

INDEXES = {
    "todos_todo_id_470cf31b_like": "id",
    "todos_todo_event_id_780be6bb_like": "event_id",
}


class Migration(migrations.Migration):
    dependencies = [("todos", "0004_admin_indexes")]

    operations = [
        migrations.RunSQL(
            f"DROP INDEX IF EXISTS {name}",
            f"CREATE INDEX IF NOT EXISTS {name} ON todos_todo ({column} varchar_pattern_ops)",
        )
        for name, column in INDEXES.items()
    ]
