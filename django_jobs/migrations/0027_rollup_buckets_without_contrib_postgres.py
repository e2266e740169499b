"""The rollups' duration buckets as a plain ``bigint[]`` column type of django-jobs' own
(:class:`django_jobs.models.fields.PgArray`), not ``django.contrib.postgres``' ``ArrayField``,
which Django 6 refuses unless ``django.contrib.postgres`` is in ``INSTALLED_APPS``
(``postgres.E005``). The column is the same ``bigint[]``: no SQL runs.
"""

from django.db import migrations

import django_jobs.models.fields


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0026_trace_context")]

    operations = [
        migrations.AlterField(
            model_name=model,
            name="duration_buckets",
            field=django_jobs.models.fields.PgArray(base_type="bigint", default=list),
        )
        for model in ("rollup", "rolluptotal")
    ]
