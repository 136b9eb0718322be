"""Named limits (issue 31): the limit rows, the limits a todo and a queue name, and the count of a limit's
live leases. Every new column is nullable with no default: adding them rewrites nothing."""


import django.contrib.postgres.fields
import django.db.models.functions.datetime
from django.db import migrations, models

from todos.sql import functions


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0029_fair_head'),
    ]

    operations = [
        migrations.AddField(
            model_name='queue',
            name='limits',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), blank=True, null=True, size=None),
        ),
        migrations.AddField(
            model_name='todo',
            name='limits',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), blank=True, editable=False, null=True, size=None),
        ),
        migrations.CreateModel(
            name='Limit',
            fields=[
                ('name', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('max_claimed', models.PositiveIntegerField(blank=True, null=True)),
                ('rate_per_second', models.FloatField(blank=True, null=True)),
                ('rate_burst', models.PositiveIntegerField(blank=True, null=True)),
                ('tokens', models.FloatField(blank=True, editable=False, null=True)),
                ('refilled_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('per_key', models.PositiveIntegerField(blank=True, null=True)),
                ('parked_until', models.DateTimeField(blank=True, null=True)),
                ('park_reason', models.CharField(blank=True, db_default='', default='', max_length=500)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('rate_per_second__isnull', True), models.Q(('rate_burst__gte', 1), ('rate_per_second__gt', 0), ('refilled_at__isnull', False), ('tokens__isnull', False)), _connector='OR'), name='limit_rate_shape')],
            },
        ),
        # Claimed todos naming limits, by limit: todos_limit_live_leases counts a limit's live leases from it.
        # Partial: a todo naming no limit (limits NULL) writes no entry, claimed or not.
        migrations.RunSQL(
            "CREATE INDEX todo_limit_leases ON todos_todo USING gin (limits) "
            "WHERE state = 'claimed' AND limits IS NOT NULL",
            "DROP INDEX todo_limit_leases",
        ),
        migrations.RunSQL(migrations.RunSQL.noop, "DROP FUNCTION IF EXISTS todos_limit_live_leases(text, text)"),
        functions.load("todos_limit_live_leases"),
    ]
