"""The thresholds of the ``django_jobs_alerts`` view, written from Python settings.

``JOBS_ALERTS`` and each task's ``@job(expected_duration=...)`` live in Python, and the view is
plain SQL that Grafana reads with no Python: so the worker, the scheduler, ``syncschedules`` and
``jobsalerts`` write them here (:func:`django_jobs.alerts.sync_thresholds`), one row per kind
and subject, and the view reads this table. A subject is a schedule, queue or task name, or
``*`` for every other one. A value of ``Infinity`` turns an alert off for its subject. Without a
row, the view uses ``JOBS_ALERTS``' defaults.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class AlertThreshold(models.Model):
    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(
        max_length=40,
        help_text="schedule_grace, queue_age, no_worker, expected_duration, overdue_p95_factor, "
        "overdue_min_seconds, exhausted_threshold or exhausted_window.",
    )
    subject = models.CharField(
        max_length=255, help_text="A schedule, queue or task name; * for every other one."
    )
    value = models.FloatField(help_text="Seconds, a factor or a count; Infinity: never fires.")
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "django_jobs_alert_threshold"
        ordering = ["kind", "subject"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "subject"], name="alert_threshold_once")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.value}"
