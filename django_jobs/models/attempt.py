"""Attempts: one row per claim of a job, kept with its outcome, error, traceback and log."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_jobs.models.job import Job
from django_jobs.states import FAILED_OUTCOMES, Outcome


class Attempt(models.Model):
    """One claim of a job: who ran it, when, and how it ended. Every error is kept."""

    Outcome = Outcome

    id = models.BigAutoField(primary_key=True)
    # Indexed by attempt_job_number_idx, whose leading column is job_id.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    number = models.IntegerField()
    worker_id = models.CharField(max_length=200)
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, db_default=Outcome.RUNNING)
    error = models.TextField(db_default="", blank=True)
    traceback = models.TextField(db_default="", blank=True)
    lease = models.UUIDField(null=True, blank=True, editable=False, help_text="The claim's token.")
    #: What the run printed and logged (its last JOBS_ATTEMPT_LOG_BYTES, secrets masked): kept
    #: up to date while it runs, at most once per JOBS_PROGRESS_INTERVAL, and when it ends.
    log = models.TextField(db_default="", blank=True, editable=False)

    class Meta:
        db_table = "django_jobs_attempt"
        ordering = ["job_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=[o.value for o in Outcome]), name="attempt_outcome_valid"
            ),
            models.CheckConstraint(condition=Q(number__gte=1), name="attempt_number_positive"),
        ]
        indexes = [
            models.Index("job", "number", name="attempt_job_number_idx"),
            # The django_jobs_recent_failures view: failed attempts, newest first.
            models.Index(
                "finished_at",
                name="attempt_failed_idx",
                condition=Q(outcome__in=sorted(FAILED_OUTCOMES)),
            ),
            # Migration 0003 also creates attempt_finished_minute_idx, an expression index on
            # the UTC minute of finished_at, for the django_jobs_throughput and
            # django_jobs_task_durations views (Django's Meta.indexes cannot express it).
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} attempt {self.number} ({self.outcome})"

    @property
    def duration(self) -> Any:
        if self.finished_at:
            return self.finished_at - self.started_at
        return None
