"""Dependencies: a job that waits until the jobs it depends on are done."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from django_jobs.models.job import Job


class Dependency(models.Model):
    """``job`` may not run before ``depends_on`` is done."""

    id = models.BigAutoField(primary_key=True)
    # Indexed by the unique constraint (job, depends_on).
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="dependency_links", db_index=False
    )
    # Indexed by dependency_depends_on_idx (depends_on, job): a job's dependents in id order, so
    # that promotion and cancellation cascades page through them in keyset batches.
    depends_on = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="dependent_links", db_index=False
    )

    class Meta:
        db_table = "django_jobs_dependency"
        constraints = [
            models.UniqueConstraint(fields=["job", "depends_on"], name="dependency_unique"),
            models.CheckConstraint(
                condition=~Q(job=models.F("depends_on")), name="dependency_not_self"
            ),
        ]
        indexes = [models.Index(fields=["depends_on", "job"], name="dependency_depends_on_idx")]

    def __str__(self) -> str:
        return f"#{self.job_id} after #{self.depends_on_id}"
