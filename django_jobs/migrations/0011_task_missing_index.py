"""Index the marks of jobs whose task workers were found without (``task_missing_since``).

A worker handing back such a job looks up the earliest mark of the task's waiting jobs. Only
marked pending jobs are in the index, so it stays small; it is built concurrently, so that
upgrading a busy queue does not block its writers.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0010_unknown_tasks_and_worker_pods"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("task"),
                models.F("task_missing_since"),
                condition=models.Q(("state", "pending"), ("task_missing_since__isnull", False)),
                name="job_task_missing_idx",
            ),
        ),
    ]
