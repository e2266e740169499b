"""Index a job's parent only where there is one.

Every claim and finish of a job writes a new row version, and with it an entry in every index
that covers the row. The foreign key's own index covered every job; this one covers children
only, which are the jobs its lookups (a parent's children) can find. It is built concurrently,
before the old one is dropped, so that upgrading a busy queue does not block its writers.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0005_hot_path_functions"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                fields=["parent"], condition=models.Q(parent__isnull=False), name="job_parent_idx"
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="children",
                to="django_jobs.job",
            ),
        ),
    ]
