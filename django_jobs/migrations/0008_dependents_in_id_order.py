"""Index a job's dependents in id order.

Promotion and cancellation cascades page through a job's dependents in keyset batches of
``workflows.BATCH``. With the foreign key's own index on ``depends_on`` alone, each page read
and sorted every dependent of the job: a cascade over a million dependents did quadratic work.
The new index is on ``(depends_on, job)``; it is built concurrently, before the old one is
dropped, so that upgrading a busy queue does not block its writers.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0007_lease_tokens"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="dependency",
            index=models.Index(fields=["depends_on", "job"], name="dependency_depends_on_idx"),
        ),
        migrations.AlterField(
            model_name="dependency",
            name="depends_on",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="dependent_links",
                to="django_jobs.job",
            ),
        ),
    ]
