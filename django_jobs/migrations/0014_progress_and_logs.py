"""Long jobs you can watch: a run's progress on its job row, its captured log on its attempt
row, and the ``django_jobs_running`` view (docs/operations.md).

The progress columns are in no index, so that a worker's progress writes are HOT updates. Each
new column is nullable or has a constant default: adding them rewrites no table.
"""

from django.db import migrations, models

# One row per running job, with the progress of its current attempt (NULL when it reported
# none), its rate since the attempt started and the seconds left at that rate.
# Index: job_running_worker_idx (partial, on state = 'running').
RUNNING_VIEW = """
CREATE OR REPLACE VIEW django_jobs_running AS
SELECT r.*,
       CASE WHEN r.progress_rate > 0 AND r.progress_total IS NOT NULL
            THEN (r.progress_total - r.progress_done) / r.progress_rate END AS eta_seconds
FROM (
    SELECT j.id AS job_id, j.task, j.queue, j.worker_id, j.attempt, j.max_attempts,
           j.started_at, EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS running_seconds,
           p.done AS progress_done, p.total AS progress_total,
           CASE WHEN p.total > 0 THEN 100 * p.done / p.total END AS progress_percent,
           p.message AS progress_message, p.updated_at AS progress_updated_at,
           CASE WHEN p.done > 0 AND p.updated_at > j.started_at
                THEN p.done / EXTRACT(EPOCH FROM p.updated_at - j.started_at)::float8
           END AS progress_rate
    FROM django_jobs_job j
    LEFT JOIN LATERAL (
        SELECT j.progress_done AS done, j.progress_total AS total,
               j.progress_message AS message, j.progress_updated_at AS updated_at
        WHERE j.progress_attempt = j.attempt
    ) p ON true
    WHERE j.state = 'running'
) r
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0013_queue_controls"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="progress_done",
            field=models.FloatField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_total",
            field=models.FloatField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_message",
            field=models.TextField(blank=True, db_default="", editable=False),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_updated_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_attempt",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="attempt",
            name="log",
            field=models.TextField(blank=True, db_default="", editable=False),
        ),
        migrations.RunSQL(RUNNING_VIEW, "DROP VIEW IF EXISTS django_jobs_running"),
    ]
