"""The table of queue controls: a queue that is paused, or that has a cluster-wide limit.

A queue needs no row to exist: jobs name their queue, and a queue without a row is open and
unlimited. A row is written when a queue is paused, or given a limit (``JOBS_QUEUE_LIMITS``,
synced when a worker starts; the admin; ``manage.py jobqueue``). The claim function reads this
table on every claim, so a change takes effect at the next claim. The logic lives in
:mod:`django_jobs.queues.controls`.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_jobs.models.fields import PgArray


class Queue(models.Model):
    class LimitSource(models.TextChoices):
        NONE = "", "none"
        SETTINGS = "settings", "JOBS_QUEUE_LIMITS"
        ADMIN = "admin", "admin or jobqueue"

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(db_default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=150, blank=True, db_default="")
    pause_reason = models.TextField(blank=True, db_default="")
    concurrency_limit = models.IntegerField(
        null=True,
        blank=True,
        help_text="At most this many jobs of the queue run at once, across all workers. "
        "Empty: no limit.",
    )
    limit_source = models.CharField(
        max_length=10, choices=LimitSource.choices, blank=True, db_default=LimitSource.NONE
    )
    # A rate limit on the queue's starts: at most rate_limit in any window of rate_period
    # seconds (JOBS_QUEUE_RATE_LIMITS, the admin, jobqueue), counted in django_jobs_rate under
    # the key "queue:<name>".
    rate_limit = models.IntegerField(
        null=True,
        blank=True,
        help_text="At most this many jobs of the queue start in any window of rate_period "
        "seconds, across all workers. Empty: no rate limit.",
    )
    rate_period = models.IntegerField(null=True, blank=True)
    rate_source = models.CharField(
        max_length=10, choices=LimitSource.choices, blank=True, db_default=LimitSource.NONE
    )
    # JOBS_FAIR_QUEUES: the claim takes the queue's jobs round-robin across their keys.
    fair = models.BooleanField(db_default=False)
    updated_at = models.DateTimeField(auto_now=True, db_default=Now())

    class Meta:
        db_table = "django_jobs_queue"
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency_limit__isnull=True) | Q(concurrency_limit__gte=1),
                name="queue_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True, rate_period__isnull=True)
                | Q(rate_limit__gte=1, rate_period__gte=1),
                name="queue_rate_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class RateWindow(models.Model):
    """The starts of one rate-limited key in its current window: the latest ``rate_limit``
    start times, oldest first. One row per key (a task's name, a ``rate_key``, or
    ``queue:<name>``), however many jobs it has; the claim writes it in the transaction that
    starts the job, so a crash cannot lose a start that happened. Rows idle for longer than
    their window are deleted by the expiry pass."""

    key = models.CharField(max_length=300, primary_key=True)
    starts = PgArray(base_type="timestamptz", default=list)
    rate_limit = models.IntegerField()
    rate_period = models.IntegerField()
    # When the window is full: the moment a start becomes possible again. NULL: there is room.
    # The claim's candidates pass over a key whose free_at is in the future without locking
    # any of its jobs.
    free_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "django_jobs_rate"
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key
