"""Steps: the recorded result of each completed ``context.step()`` of a job, kept across its
attempts, so that a retry, a reap or a release replays past the steps already done.

A job's cursors (``context.save_cursor()``) are small and written often, so they live on the job
row itself (``Job.cursors``), in place; a step's result may be large and is written once, so
steps have this table. Both go when their job goes: the foreign key is ``ON DELETE CASCADE`` in
the database (migration 0021), whatever deletes the job (``prunejobs``, the admin, SQL).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_jobs.models.job import Job

#: The longest step or cursor name, in characters.
NAME_CHARS = 200


class Step(models.Model):
    """One completed step of a job: its name, the attempt that recorded it, and its result."""

    id = models.BigAutoField(primary_key=True)
    # The foreign key is made by migration 0021 with ON DELETE CASCADE, which Django cannot
    # declare; Django leaves a job's steps to it (DO_NOTHING). Indexed by step_job_name_unique.
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="steps",
    )
    name = models.CharField(max_length=NAME_CHARS)
    #: The attempt (``Job.attempt``) that recorded it.
    attempt = models.IntegerField()
    #: The lease of the run that recorded it.
    lease = models.UUIDField(null=True, blank=True, editable=False)
    result = models.JSONField(null=True, blank=True)
    #: The size of the result's JSON text, in bytes.
    result_bytes = models.IntegerField(db_default=0)
    recorded_at = models.DateTimeField(db_default=Now())
    #: Seconds the step's function ran before its result was recorded.
    duration = models.FloatField(db_default=0.0)

    class Meta:
        db_table = "django_jobs_step"
        ordering = ["job_id", "id"]
        constraints = [
            # A step name is recorded once per job; the index serves every read of a job's steps.
            models.UniqueConstraint(fields=["job", "name"], name="step_job_name_unique"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="step_attempt_positive"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} step {self.name!r} (attempt {self.attempt})"
