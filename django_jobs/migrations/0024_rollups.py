"""Hourly rollups (django_jobs/rollups.py): the history of finished jobs that outlives pruning.

Three small tables: the hourly rows, their all-time totals (never pruned; Prometheus' counters),
and the one row of the watermark, which the first pass writes. Nothing reads the job
table differently: a pass reads finished jobs through ``job_finished_idx`` and ended attempts
through ``attempt_finished_minute_idx``, an hour at a time.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

# The hourly rows as a documented, stable view (docs/operations.md): what Grafana and other
# readers query, with the mean run time worked out. Reads django_jobs_rollup through its unique
# index rollup_once_per_hour (the hour first) for a range of hours.
VIEW = """
CREATE VIEW django_jobs_rollups AS
SELECT hour, queue, task, outcome, jobs, attempts, duration_seconds_total, duration_seconds_max,
       CASE WHEN attempts > 0 THEN duration_seconds_total / attempts END AS duration_seconds_mean,
       duration_buckets, waited_jobs, wait_seconds_total, wait_seconds_max,
       CASE WHEN waited_jobs > 0 THEN wait_seconds_total / waited_jobs END AS wait_seconds_mean
FROM django_jobs_rollup
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0023_checkpoint_function"),
    ]

    operations = [
        migrations.CreateModel(
            name="Rollup",
            fields=[
                ("queue", models.CharField(max_length=100)),
                ("task", models.CharField(max_length=255)),
                ("outcome", models.CharField(max_length=16)),
                ("jobs", models.BigIntegerField(default=0)),
                ("attempts", models.BigIntegerField(default=0)),
                ("duration_seconds_total", models.FloatField(default=0.0)),
                ("duration_seconds_max", models.FloatField(blank=True, null=True)),
                (
                    "duration_buckets",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.BigIntegerField(), default=list, size=None
                    ),
                ),
                ("waited_jobs", models.BigIntegerField(default=0)),
                ("wait_seconds_total", models.FloatField(default=0.0)),
                ("wait_seconds_max", models.FloatField(blank=True, null=True)),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("hour", models.DateTimeField(help_text="The UTC hour's start.")),
            ],
            options={
                "db_table": "django_jobs_rollup",
                "ordering": ["-hour", "queue", "task", "outcome"],
                "indexes": [
                    models.Index(
                        models.F("task"),
                        models.F("outcome"),
                        models.F("hour"),
                        name="rollup_task_outcome_hour_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("hour", "queue", "task", "outcome"), name="rollup_once_per_hour"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="RollupState",
            fields=[
                ("id", models.SmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("rolled_until", models.DateTimeField(blank=True, null=True)),
                ("rolled_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "django_jobs_rollup_state",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("id", 1)), name="rollup_state_one_row"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="RollupTotal",
            fields=[
                ("queue", models.CharField(max_length=100)),
                ("task", models.CharField(max_length=255)),
                ("outcome", models.CharField(max_length=16)),
                ("jobs", models.BigIntegerField(default=0)),
                ("attempts", models.BigIntegerField(default=0)),
                ("duration_seconds_total", models.FloatField(default=0.0)),
                ("duration_seconds_max", models.FloatField(blank=True, null=True)),
                (
                    "duration_buckets",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.BigIntegerField(), default=list, size=None
                    ),
                ),
                ("waited_jobs", models.BigIntegerField(default=0)),
                ("wait_seconds_total", models.FloatField(default=0.0)),
                ("wait_seconds_max", models.FloatField(blank=True, null=True)),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ],
            options={
                "db_table": "django_jobs_rollup_total",
                "ordering": ["queue", "task", "outcome"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "task", "outcome"), name="rollup_total_once"
                    )
                ],
            },
        ),
        migrations.RunSQL(VIEW, "DROP VIEW IF EXISTS django_jobs_rollups"),
    ]
