"""Storage settings for a high-churn queue table (SPEC "Measured here", trap 3).

Every claim, heartbeat and completion rewrites a row, so dead tuples pile up fast. Stock autovacuum
waits for 20% of the table to be dead, which on a large table of history is never soon enough: the
pending index fills with dead entries and claims slow down. A fixed threshold vacuums every few
thousand changes whatever the table's size, with no cost-based sleeping. fillfactor leaves room on
each page so an updated row's new version usually lands on the same page.
"""

from django.db import migrations

TUNE = """
ALTER TABLE todos_todo SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);
"""

UNTUNE = """
ALTER TABLE todos_todo RESET (
    fillfactor,
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_vacuum_insert_threshold,
    autovacuum_analyze_scale_factor,
    autovacuum_analyze_threshold,
    autovacuum_vacuum_cost_delay
);
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0001_initial")]

    operations = [migrations.RunSQL(TUNE, UNTUNE)]
