"""The admin's event-type filter and its choices (events/admin.py). Built CONCURRENTLY so a large
events table keeps taking deliveries meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("events", "0001_initial")]

    operations = [
        AddIndexConcurrently("event", models.Index(fields=["type", "-received_at"], name="event_type_recent")),
    ]
