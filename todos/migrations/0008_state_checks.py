"""CHECK constraints on the state column's values and on each state's shape (todos/states.py, SHAPES).

Each is added NOT VALID (no scan, so the table's ACCESS EXCLUSIVE lock lasts an instant) and then
validated in its own transaction, which scans under SHARE UPDATE EXCLUSIVE: claims and completions keep
running while a large table is checked.
"""

from django.db import migrations, models


class AddCheckThenValidate(migrations.AddConstraint):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table = schema_editor.quote_name(model._meta.db_table)
        name = schema_editor.quote_name(self.constraint.name)
        check = self.constraint._get_check_sql(model, schema_editor)
        schema_editor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({check}) NOT VALID")
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('events', '0002_event_type_recent'),
        ('todos', '0007_pending_scan_nulls_first'),
    ]

    operations = [
        AddCheckThenValidate(
            model_name='todo',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'claimed', 'done', 'failed'])), name='todo_state_valid'),
        ),
        AddCheckThenValidate(
            model_name='todo',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'pending'), _negated=True), models.Q(('next_retry_at__isnull', True), ('completed_at__isnull', True)), _connector='OR'), name='todo_pending_shape'),
        ),
        AddCheckThenValidate(
            model_name='todo',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'claimed'), _negated=True), models.Q(('lease_expires_at__isnull', False), ('lease_id__isnull', False), ('owner__isnull', False), ('next_retry_at__isnull', True), ('completed_at__isnull', True)), _connector='OR'), name='todo_claimed_shape'),
        ),
        AddCheckThenValidate(
            model_name='todo',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'done'), _negated=True), models.Q(('completed_at__isnull', False), ('lease_expires_at__isnull', True), ('lease_id__isnull', True), ('next_retry_at__isnull', True)), _connector='OR'), name='todo_done_shape'),
        ),
        AddCheckThenValidate(
            model_name='todo',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'failed'), _negated=True), models.Q(('completed_at__isnull', True), models.Q(('next_retry_at__isnull', True), models.Q(('lease_expires_at__isnull', True), ('lease_id__isnull', True)), _connector='OR')), _connector='OR'), name='todo_failed_shape'),
        ),
        AddCheckThenValidate(
            model_name='todo',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(models.Q(('lease_expires_at__isnull', True), ('lease_id__isnull', True)), models.Q(('lease_expires_at__isnull', False), ('lease_id__isnull', False)), _connector='OR'), models.Q(('lease_id__isnull', True), ('owner__isnull', False), _connector='OR')), name='todo_lease_coherent'),
        ),
    ]
