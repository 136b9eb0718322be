"""Waits for people (issue 29): the waitpoint's question, deciders, reminder and escalation times, and
who decided; signed decision links (only their hashes). Every new waitpoint column is nullable or defaults
to empty in the database, so a process of the previous release still makes waits during a deploy.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0027_outbound_notices'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='DecisionLink',
            fields=[
                ('token_hash', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('todo_id', models.CharField(max_length=40)),
                ('wait_created_at', models.DateTimeField()),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('expires_at', models.DateTimeField()),
                ('used_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='decided_by',
            field=models.CharField(blank=True, max_length=150, null=True),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='decider_groups',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), blank=True, db_default=models.Value([]), size=None),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='decider_users',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), blank=True, db_default=models.Value([]), size=None),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='escalate_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='escalate_groups',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), blank=True, db_default=models.Value([]), size=None),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='escalated_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='people',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='remind_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='waitpoint',
            name='reminded_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='waitpoint',
            index=models.Index(condition=models.Q(('remind_at__isnull', False), ('reminded_at__isnull', True), ('resolved_at__isnull', True)), fields=['remind_at'], name='waitpoint_remind_due'),
        ),
        migrations.AddIndex(
            model_name='waitpoint',
            index=models.Index(condition=models.Q(('escalate_at__isnull', False), ('escalated_at__isnull', True), ('resolved_at__isnull', True)), fields=['escalate_at'], name='waitpoint_escalate_due'),
        ),
        migrations.AddIndex(
            model_name='waitpoint',
            index=models.Index(condition=models.Q(('people__isnull', False), ('resolved_at__isnull', True)), fields=['created_at'], name='waitpoint_open_people'),
        ),
        migrations.AddField(
            model_name='decisionlink',
            name='user',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddIndex(
            model_name='decisionlink',
            index=models.Index(fields=['expires_at'], name='decisionlink_expiry'),
        ),
    ]
