"""Agent trees (issue 30): a todo's parent_id, root_id and depth (NULL for a root, so existing todos are roots
and a plain create writes nothing more), a root's lifetime count of descendants and its own spawn caps, the
lineage indexes (partial: children only), and the spawn caps of a queue's trees. Every column is nullable
with no default: adding them rewrites nothing, and a process of the previous release keeps creating roots
during a deploy.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('events', '0003_event_body_sha256'),
        ('todos', '0025_waitpoint_waiter_and_resolvers'),
    ]

    operations = [
        migrations.AddField(
            model_name='queue',
            name='max_children',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='max_depth',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='queue',
            name='max_descendants',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='depth',
            field=models.PositiveSmallIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='descendants',
            field=models.PositiveIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='parent_id',
            field=models.CharField(blank=True, editable=False, max_length=40, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='root_id',
            field=models.CharField(blank=True, editable=False, max_length=40, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='spawn_caps',
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name='todo',
            index=models.Index(condition=models.Q(('parent_id__isnull', False)), fields=['parent_id'], name='todo_children'),
        ),
        migrations.AddIndex(
            model_name='todo',
            index=models.Index(condition=models.Q(('root_id__isnull', False)), fields=['root_id', 'depth', 'id'], name='todo_tree'),
        ),
    ]
