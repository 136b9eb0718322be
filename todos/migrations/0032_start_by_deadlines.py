"""Start-by deadlines (issue 31): a todo's expires_at (nullable, no default: nothing rewritten) and the reaper's
index of the never-claimed todos that have one."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0031_rate_per_key'),
    ]

    operations = [
        migrations.AddField(
            model_name='todo',
            name='expires_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        # The reaper's EXPIRE: never-claimed todos with a deadline, by deadline. Partial: a todo without one
        # (every plain create) writes no entry, and a claim takes its entry out of the predicate.
        migrations.RunSQL(
            "CREATE INDEX todo_expiry ON todos_todo (expires_at) WHERE expires_at IS NOT NULL AND claimed_at IS NULL",
            "DROP INDEX todo_expiry",
        ),
    ]
