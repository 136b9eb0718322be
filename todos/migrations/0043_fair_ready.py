"""Issue 31: fair reservations. A contended fair turn charges the next FAIR_RESERVE tags and leaves the todos it
did not claim in todos_fairready, which CLAIM_FAIR_READY hands out without the queue's lock; the walk, the head,
a key's first todo and the key scan skip them (texts in todos/sql/functions/; todos/sql/claim.py)."""

from django.db import migrations, models

from todos.sql import functions


class Migration(migrations.Migration):
    dependencies = [("todos", "0042_failed_recent_dead_letters_only")]

    operations = [
        migrations.CreateModel(
            name="FairReady",
            fields=[
                ("id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=200)),
                ("priority", models.SmallIntegerField()),
                ("tag", models.FloatField()),
                ("fair_key", models.CharField(max_length=200)),
            ],
            options={"indexes": [models.Index(fields=["queue", "priority", "tag"], name="fair_ready_claim")]},
        ),
        functions.load("todos_fair_reserved", "todos_fair_walk", "todos_fair_head", "todos_fair_key_first"),
    ]
