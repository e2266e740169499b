"""Children belong to an attempt of their parent; claims and finishes lock FOR NO KEY UPDATE.

A child records the attempt of its parent that spawned it (``parent_attempt``): a parent's
outcome is decided by the children of its final attempt, and the unfinished children of an
attempt that did not succeed are cancelled when it ends (workflows.py). The column is nullable
and added without a default, so adding it rewrites no table; children made before it count
for every attempt, as before.

The claim and the finish lock their job ``FOR NO KEY UPDATE``, which a transaction that
enqueues a dependent or a child of the job (its foreign key check takes ``FOR KEY SHARE``)
never blocks. The finish considers only the children of the attempt it ends, and says whether
that attempt left unfinished children. Its result changes shape, so both functions are dropped
and made again: restart the workers after migrating. The functions are version 3 of each
in django_jobs/store/sql/functions/; going back makes version 2 again.
"""

from django.db import migrations, models

from django_jobs.store.sql.functions import replace_function

DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[])"
DROP_FINISH = (
    "DROP FUNCTION IF EXISTS django_jobs_finish(bigint, integer, text, uuid, text, text, text,"
    " text, boolean, float8)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0008_dependents_in_id_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="parent_attempt",
            field=models.IntegerField(
                blank=True,
                help_text="The parent's attempt that spawned this job: a parent's outcome is "
                "decided by the children of its final attempt.",
                null=True,
            ),
        ),
        replace_function("django_jobs_claim", 3, drop=DROP_CLAIM, reverse_drop=DROP_CLAIM),
        replace_function("django_jobs_finish", 3, drop=DROP_FINISH, reverse_drop=DROP_FINISH),
    ]
