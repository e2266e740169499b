"""What keeps the reaper's pass and the controlled claim flat as the job table grows.

The reaper's repair reads waiting parents from ``job_waiting_parent_idx``, a page of waiting
dependents from ``job_waiting_dependent_idx``, and stray children from ``job_active_child_idx`` (active children
of a recorded attempt only), so that a pass no longer walks every waiting job, nor every child
a workflow ever had. Both are partial and built concurrently, so that upgrading a busy queue does
not block its writers.

Version 6 of the claim function claims a job without a key from its queue's own part of
``job_claim_free_queue_idx`` (the queue matched as a range): with a paused or full queue's
backlog ahead, version 5's plan could walk that backlog. Restart the workers after migrating;
going back makes version 5 again.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from django_jobs.store.sql.functions import replace_function


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0018_queue_demand"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("id"),
                condition=models.Q(("attempt__gt", 0), ("state", "waiting")),
                name="job_waiting_parent_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("id"),
                condition=models.Q(("attempt", 0), ("state", "waiting")),
                name="job_waiting_dependent_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("parent"),
                condition=models.Q(
                    ("parent__isnull", False),
                    ("parent_attempt__isnull", False),
                    ("state__in", ["waiting", "pending"]),
                ),
                name="job_active_child_idx",
            ),
        ),
        replace_function("django_jobs_claim", 6),
    ]
