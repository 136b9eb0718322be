# The provider choices come from the registry (ingest/providers/), by reference: adding a provider
# changes no migration. Choices are not stored in the database, so this alters nothing there.

import ingest.providers
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ingest', '0002_stream_provider'),
    ]

    operations = [
        migrations.AlterField(
            model_name='source',
            name='provider',
            field=models.CharField(choices=ingest.providers.choices, max_length=20),
        ),
    ]
