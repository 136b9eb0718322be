"""Event.body_sha256 and its partial index, for the replay check of providers that sign only the body
(issue 28, security-review L2). The column is nullable (no table rewrite) and the index is built
CONCURRENTLY, so a large events table keeps taking deliveries meanwhile; existing rows stay null."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("events", "0002_event_type_recent")]

    operations = [
        migrations.AddField(
            model_name="event",
            name="body_sha256",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        AddIndexConcurrently(
            "event",
            models.Index(
                condition=models.Q(("body_sha256__isnull", False)),
                fields=["source", "body_sha256"],
                name="event_body_sha256",
            ),
        ),
    ]
