"""A fair queue's per-key rate (issue 31): rate_per_key on the queue, a token bucket per key on its fairkey row,
and the walk that skips keys without a token. Nullable columns: nothing rewritten."""

from django.db import migrations, models

from todos.sql import functions


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0030_named_limits'),
    ]

    operations = [
        migrations.AddField(
            model_name='fairkey',
            name='refilled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='fairkey',
            name='tokens',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='rate_per_key',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.RunSQL(
            "DROP FUNCTION IF EXISTS todos_fair_walk(text, smallint, text, integer, integer)",
            migrations.RunSQL.noop,
        ),
        migrations.RunSQL(
            migrations.RunSQL.noop,
            "DROP FUNCTION IF EXISTS todos_fair_walk(text, smallint, text, integer, integer, double precision, jsonb);"
            "DROP FUNCTION IF EXISTS todos_fair_key_tokens(text, text, double precision)",
        ),
        functions.load("todos_fair_key_tokens", "todos_fair_walk"),
    ]
