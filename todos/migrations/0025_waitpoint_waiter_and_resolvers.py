"""Who waits and who may resolve a wait (issue 28). Open waits made before this migration get their waiter
from the todo's owner (a waiting todo keeps the owner that waited), so that it cannot resolve them either;
they name no resolvers, so only their token and operators resolve them. The resolver columns default to
empty in the database, so a process of the previous release still makes waits during a deploy.
"""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0024_admin_login_throttle'),
    ]

    operations = [
        migrations.AddField(
            model_name='waitpoint',
            name='resolver_agents',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=100), blank=True, db_default=models.Value([]), size=None),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='resolver_scopes',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=300), blank=True, db_default=models.Value([]), size=None),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='waiter',
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.AddIndex(
            model_name='waitpoint',
            index=models.Index(condition=models.Q(('event_key__isnull', False), ('resolved_at__isnull', True)), fields=['waiter'], name='waitpoint_open_event_waiter'),
        ),
        migrations.RunSQL(
            """UPDATE todos_waitpoint w SET waiter = split_part(t.owner, '/', 1)
            FROM todos_todo t WHERE t.id = w.todo_id AND w.resolved_at IS NULL AND t.owner IS NOT NULL""",
            migrations.RunSQL.noop,
        ),
    ]
