"""Jobs whose task no worker has yet, and what a worker registry row says of its worker.

A worker hands back a job whose task it has not registered (a rolling deploy) without counting
an attempt, and passes over that task's jobs for a while: the claim function takes a third
argument, the tasks to pass over. ``task_missing_since`` marks since when workers have been
found without a job's task; ``JOBS_UNKNOWN_TASK_TIMEOUT`` counts from there, and a finish, a
reap or a release clears it, so the finish function is made again too. Both functions are
dropped and made again: restart the workers after migrating. The functions are version 4 of each in
django_jobs/store/sql/functions/; going back makes version 3 again.

A worker row records the worker's pod (``POD_NAME``), which Kubernetes liveness looks up, and
the task names the worker has registered. Every column is added without a rewrite of its table.
"""

from django.db import migrations, models

from django_jobs.store.sql.functions import replace_function

DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[])"
DROP_NEW_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[], text[])"
DROP_FINISH = (
    "DROP FUNCTION IF EXISTS django_jobs_finish(bigint, integer, text, uuid, text, text, text,"
    " text, boolean, float8)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0009_children_of_an_attempt"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="task_missing_since",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text="When a worker first handed the job back because it has not registered the task (a rolling deploy, say). JOBS_UNKNOWN_TASK_TIMEOUT counts from here.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="pod",
            field=models.CharField(
                blank=True,
                db_default="",
                help_text="The worker's Kubernetes pod (POD_NAME), for liveness checks; empty elsewhere.",
                max_length=253,
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="tasks",
            field=models.JSONField(
                db_default=models.Value([], models.JSONField()),
                help_text="The task names this worker has registered.",
            ),
        ),
        replace_function("django_jobs_claim", 4, drop=DROP_CLAIM, reverse_drop=DROP_NEW_CLAIM),
        replace_function("django_jobs_finish", 4, drop=DROP_FINISH, reverse_drop=DROP_FINISH),
    ]
