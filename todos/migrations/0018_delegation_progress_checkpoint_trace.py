"""Issue 21 (delegation): a todo's latest progress and checkpoint (written by heartbeats under the receipt)
and its W3C traceparent. Nullable, no default: no table rewrite, and no index (they are read with the row).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        # After issue 20's waiting state (merged beside this branch) and main's 0019; the coordinator relinks.
        ("todos", "0015_waiting_state"),
        ("todos", "0019_search_and_retry_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name='todo',
            name='checkpoint',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='progress',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='todo',
            name='traceparent',
            field=models.CharField(blank=True, max_length=55, null=True),
        ),
    ]
