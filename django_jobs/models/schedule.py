"""Tables of periodic jobs: the schedules, and one row per tick that a scheduler handled.

A schedule is declared in code (``@job(schedule=...)``, ``JOBS_SCHEDULES``; synced into this
table when a scheduler starts) or made in the admin. The unique constraint on a tick's
``(schedule, fire_at)`` is what makes a tick enqueue once however many schedulers run. The
logic lives in :mod:`django_jobs.schedules.declarations` and
:mod:`django_jobs.schedules.ticks`; the methods here only call it.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_jobs import conf
from django_jobs.models.job import Job


class Schedule(models.Model):
    class CatchUp(models.TextChoices):
        SKIP = "skip", "skip missed ticks"
        LATEST = "latest", "run the latest missed tick"

    class Overlap(models.TextChoices):
        ALLOW = "allow", "allow"
        SKIP = "skip", "skip while the previous run is active"

    class WhenQueuePaused(models.TextChoices):
        SKIP = "skip", "skip the tick (recorded as queue paused)"
        ENQUEUE = "enqueue", "enqueue the job all the same"

    class Source(models.TextChoices):
        CODE = "code", "code"
        ADMIN = "admin", "admin"

    name = models.CharField(max_length=200, unique=True)
    task = models.CharField(max_length=200, help_text="Registered name of the @job function.")
    cron = models.CharField(
        max_length=200, help_text="5-field cron expression, or @daily, @hourly, ..."
    )
    timezone = models.CharField(max_length=64, default="UTC")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(
        max_length=100, blank=True, default="", help_text="Empty: the task's queue."
    )
    priority = models.IntegerField(null=True, blank=True, help_text="Empty: the task's.")
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.SKIP)
    overlap = models.CharField(max_length=10, choices=Overlap.choices, default=Overlap.ALLOW)
    when_queue_paused = models.CharField(
        max_length=10,
        choices=WhenQueuePaused.choices,
        default=WhenQueuePaused.SKIP,
        db_default=WhenQueuePaused.SKIP,
        help_text="What a tick does while the job's queue is paused.",
    )
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.ADMIN)
    missing_from_code_since = models.DateTimeField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.BigIntegerField(null=True, blank=True)
    last_outcome = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "django_jobs_schedule"
        ordering = ["name"]
        permissions = [
            ("pause_schedule", "Can pause and resume schedules"),
            ("run_schedule", "Can run a schedule now"),
        ]
        indexes = [
            models.Index(
                fields=["next_run_at"],
                name="schedule_due_idx",
                condition=Q(paused=False, missing_from_code_since__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return self.name

    # The operators' actions on one schedule. They live in schedules/ticks.py, a layer above
    # the models, imported when called; ticks never imports this module at run time, so no
    # import circle closes.

    def pause(self, by: str) -> None:
        """Stop firing until :meth:`resume`; kept across syncs."""
        from django_jobs.schedules import ticks

        ticks.pause(self.pk, by)
        self.refresh_from_db()

    def resume(self) -> None:
        """Fire again from the next tick after now (ticks missed while paused are not run)."""
        from django_jobs.schedules import ticks

        ticks.resume(self.pk)
        self.refresh_from_db()

    def run_now(self) -> Job:
        """Enqueue one job now, as a tick would (recorded as a tick "run now")."""
        from django_jobs.schedules import ticks

        job_id = ticks.run_now(self.pk)
        self.refresh_from_db()
        return Job.objects.using(conf.database_alias()).get(pk=job_id)

    def recompute_next_run(self) -> None:
        """Set ``next_run_at`` from the cron expression and time zone after an edit."""
        from django_jobs.schedules import ticks

        ticks.recompute_next_run(self.pk)
        self.refresh_from_db()


class ScheduleTick(models.Model):
    class Outcome(models.TextChoices):
        ENQUEUED = "enqueued"
        OVERLAP = "skipped: previous run active"
        RUN_NOW = "run now"
        QUEUE_PAUSED = "skipped: queue paused"

    schedule = models.ForeignKey(
        Schedule,
        on_delete=models.CASCADE,
        related_name="ticks",
        db_index=False,  # schedule_tick_once, below, leads with it
    )
    fire_at = models.DateTimeField()
    job_id = models.BigIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=100)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "django_jobs_schedule_tick"
        ordering = ["-fire_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "fire_at"], name="schedule_tick_once")
        ]
        indexes = [models.Index(fields=["created_at"], name="schedule_tick_created_idx")]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.fire_at:%Y-%m-%d %H:%M}: {self.outcome}"
