"""A trigram index for the admin's free-text title search (bench/admin/title_search.py, docs/benchmarks.md).

pg_trgm is a trusted extension (PostgreSQL 13+), so the database owner may create it. The index is
built concurrently: creates and transitions keep running while it builds on a big table.
"""

import django.contrib.postgres.indexes
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently, TrigramExtension
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("events", "0002_event_type_recent"),
        ("todos", "0009_queue_registry_trigger"),
    ]

    operations = [
        TrigramExtension(),
        AddIndexConcurrently(
            model_name="todo",
            index=django.contrib.postgres.indexes.GinIndex(
                django.contrib.postgres.indexes.OpClass(
                    django.db.models.functions.text.Upper("title"), name="gin_trgm_ops"
                ),
                name="todo_title_trgm",
            ),
        ),
    ]
