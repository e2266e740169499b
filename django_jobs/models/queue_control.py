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
        ]

    def __str__(self) -> str:
        return self.name
