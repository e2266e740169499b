"""Leases that a server crash cannot repeat: a random token per claim.

A claim draws a new token with ``gen_random_uuid()`` and stores it on the job and on its attempt
row. Every later write of that run (heartbeat, finish, release, reap) is fenced on it. An attempt
number alone could be handed out twice: a crash that lost a claim would roll the number back, and
the next claim would repeat it. The columns are nullable and added without a default, so that
adding them rewrites no table; rows claimed before this migration keep a NULL lease, which the
fences match as NULL.

The claim and finish functions change shape (the claim returns the token, the finish takes it),
so they are dropped and made again. Workers that run code from before this migration fail their
claims and finishes until they are replaced: restart the workers after migrating. The functions
are version 2 of each in django_jobs/store/sql/functions/; going back makes version 1 again.
"""

from django.db import migrations, models

from django_jobs.store.sql.functions import replace_function

DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[])"
DROP_FINISH = (
    "DROP FUNCTION IF EXISTS django_jobs_finish(bigint, integer, text, text, text, text, text,"
    " boolean, float8)"
)
DROP_NEW_FINISH = (
    "DROP FUNCTION IF EXISTS django_jobs_finish(bigint, integer, text, uuid, text, text, text,"
    " text, boolean, float8)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0006_partial_parent_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="lease",
            field=models.UUIDField(
                blank=True,
                editable=False,
                help_text="Random token of the latest claim; every later write of that run is "
                "fenced on it. A server crash cannot roll it back into a value that is handed out "
                "again.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="attempt",
            name="lease",
            field=models.UUIDField(
                blank=True, editable=False, help_text="The claim's token.", null=True
            ),
        ),
        replace_function("django_jobs_claim", 2, drop=DROP_CLAIM, reverse_drop=DROP_CLAIM),
        replace_function("django_jobs_finish", 2, drop=DROP_FINISH, reverse_drop=DROP_NEW_FINISH),
    ]
