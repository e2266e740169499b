"""Long jobs that keep their work: the step table, the job's cursors, and a step count in the
``django_jobs_running`` view (docs/operations.md).

``django_jobs_step`` holds one row per completed ``context.step()`` of a job, kept across its
attempts; its foreign key to the job is ``ON DELETE CASCADE``, made here in SQL (Django cannot
declare it), so that a job's steps go with the job whatever deletes it. ``Job.cursors`` is in no
index, so that a cursor save, written with the run's progress, stays a HOT update; adding a
nullable column rewrites no table.
"""

import importlib

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

#: The view as 0014 made it, made again going backwards (a column cannot be dropped from a view).
RUNNING_VIEW_0014 = importlib.import_module(
    "django_jobs.migrations.0014_progress_and_logs"
).RUNNING_VIEW

FOREIGN_KEY = """
ALTER TABLE django_jobs_step ADD CONSTRAINT step_job_fk FOREIGN KEY (job_id)
    REFERENCES django_jobs_job (id) ON DELETE CASCADE
"""

# The running jobs, as in 0014, with two columns more at the end: the steps the job has
# recorded (over all its attempts) and the cursors it has saved.
# Index: job_running_worker_idx (partial, on state = 'running'); step_job_name_unique.
RUNNING_VIEW = """
CREATE OR REPLACE VIEW django_jobs_running AS
SELECT r.*,
       CASE WHEN r.progress_rate > 0 AND r.progress_total IS NOT NULL
            THEN (r.progress_total - r.progress_done) / r.progress_rate END AS eta_seconds,
       (SELECT count(*) FROM django_jobs_step s WHERE s.job_id = r.job_id) AS steps,
       (SELECT count(*) FROM jsonb_object_keys(
            (SELECT j.cursors FROM django_jobs_job j WHERE j.id = r.job_id))) AS cursors
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

# Every recorded step, with its job's task and state: for Grafana's panels of step counts and
# durations per task. Index: step_job_name_unique, and the job table's primary key.
STEPS_VIEW = """
CREATE VIEW django_jobs_steps AS
SELECT s.job_id, j.task, j.queue, j.state, s.name, s.attempt, s.recorded_at,
       s.duration AS duration_seconds, s.result_bytes
FROM django_jobs_step s
JOIN django_jobs_job j ON j.id = s.job_id
"""


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0020_claim_in_one_statement")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="cursors",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name="Step",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=200)),
                ("attempt", models.IntegerField()),
                ("lease", models.UUIDField(blank=True, editable=False, null=True)),
                ("result", models.JSONField(blank=True, null=True)),
                ("result_bytes", models.IntegerField(db_default=0)),
                (
                    "recorded_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("duration", models.FloatField(db_default=0.0)),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="steps",
                        to="django_jobs.job",
                    ),
                ),
            ],
            options={
                "db_table": "django_jobs_step",
                "ordering": ["job_id", "id"],
                "constraints": [
                    models.UniqueConstraint(fields=("job", "name"), name="step_job_name_unique"),
                    models.CheckConstraint(
                        condition=models.Q(("attempt__gte", 1)), name="step_attempt_positive"
                    ),
                ],
            },
        ),
        migrations.RunSQL(FOREIGN_KEY, "ALTER TABLE django_jobs_step DROP CONSTRAINT step_job_fk"),
        migrations.RunSQL(
            RUNNING_VIEW,
            ["DROP VIEW django_jobs_running", RUNNING_VIEW_0014],
        ),
        migrations.RunSQL(STEPS_VIEW, "DROP VIEW django_jobs_steps"),
    ]
