"""Hourly rollups: the history of finished jobs and attempts that outlives ``prunejobs``.

:mod:`django_jobs.rollups` writes them, one pass at a time, each pass one statement that moves
the watermark in :class:`RollupState` and writes the hours behind it, so that an hour is rolled
up exactly once however many workers try at once, and a crash rolls back the whole pass.

- :class:`Rollup`: one row per UTC hour, queue, task and outcome, kept for
  ``JOBS_ROLLUP_RETENTION`` (months);
- :class:`RollupTotal`: the same counts summed over all time, per queue, task and outcome, never
  pruned: what Prometheus' counters read.

``outcome`` is a job's final state (done, error, cancelled) for ``jobs``, and an attempt's
outcome (done, error, timeout, lost, crashed, cancelled, released) for ``attempts`` and the
durations: the row ``(…, "error")`` counts the jobs that ended in error and the attempts that
failed with an error; the row ``(…, "timeout")`` has attempts only.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from django_jobs.models.fields import PgArray


class Counts(models.Model):
    """What a rollup row counts (both tables)."""

    queue = models.CharField(max_length=100)
    task = models.CharField(max_length=255)
    outcome = models.CharField(max_length=16)
    #: Jobs that ended in this state (done, error, cancelled).
    jobs = models.BigIntegerField(default=0)
    #: Attempts that ended with this outcome, and their run time.
    attempts = models.BigIntegerField(default=0)
    duration_seconds_total = models.FloatField(default=0.0)
    duration_seconds_max = models.FloatField(null=True, blank=True)
    #: Attempts per duration bucket: entry i counts the durations d with
    #: ``DURATION_BOUNDS[i-1] < d <= DURATION_BOUNDS[i]`` (django_jobs/rollups.py), as
    #: Prometheus' ``le`` counts; the last entry, those over the last bound.
    duration_buckets = PgArray(base_type="bigint", default=list)
    #: The ended jobs that had started: the seconds their final attempt waited from ready
    #: (run_after) to its start.
    waited_jobs = models.BigIntegerField(default=0)
    wait_seconds_total = models.FloatField(default=0.0)
    wait_seconds_max = models.FloatField(null=True, blank=True)

    class Meta:
        abstract = True


class Rollup(Counts):
    id = models.BigAutoField(primary_key=True)
    hour = models.DateTimeField(help_text="The UTC hour's start.")

    class Meta:
        db_table = "django_jobs_rollup"
        ordering = ["-hour", "queue", "task", "outcome"]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "queue", "task", "outcome"], name="rollup_once_per_hour"
            )
        ]
        indexes = [
            # A task's hours of one outcome (job_overdue's p95 baseline: its successful
            # attempts of the last 7 days).
            models.Index("task", "outcome", "hour", name="rollup_task_outcome_hour_idx")
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} {self.queue} {self.task} {self.outcome}"


class RollupTotal(Counts):
    id = models.BigAutoField(primary_key=True)

    class Meta:
        db_table = "django_jobs_rollup_total"
        ordering = ["queue", "task", "outcome"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "task", "outcome"], name="rollup_total_once")
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.task} {self.outcome}"


class RollupState(models.Model):
    """The one row of the rollups' watermark: every hour before ``rolled_until`` is rolled up,
    and no later one is."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    rolled_until = models.DateTimeField(null=True, blank=True)
    rolled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_jobs_rollup_state"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="rollup_state_one_row")]

    def __str__(self) -> str:
        return f"rolled up until {self.rolled_until}"
