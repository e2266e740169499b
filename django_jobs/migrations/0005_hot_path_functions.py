"""The worker's claim and finish as PL/pgSQL functions.

PostgreSQL plans the statements inside a PL/pgSQL function once per connection and keeps the
plans, so a worker that calls these functions does not pay for planning its two statements on
every job. No statement is prepared on the protocol, so this works through pgbouncer in
transaction-pooling mode. The functions are version 1 of each in django_jobs/store/sql/functions/.
"""

from django.db import migrations

from django_jobs.store.sql.functions import replace_function


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0004_admin_indexes_and_dashboard"),
    ]

    operations = [
        replace_function(
            "django_jobs_claim", 1, reverse_drop="DROP FUNCTION django_jobs_claim(text, text[])"
        ),
        replace_function(
            "django_jobs_finish",
            1,
            reverse_drop="DROP FUNCTION django_jobs_finish(bigint, integer, text, text, text, text,"
            " text, boolean, float8)",
        ),
    ]
