"""The worker registry: one row per worker process, kept up to date by its heartbeats; the
reaper judges running jobs by it."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class Worker(models.Model):
    """The worker registry: one row per live worker process, refreshed by its heartbeat."""

    id = models.CharField(max_length=200, primary_key=True)
    name = models.CharField(max_length=200, help_text="Pod name or host, shared by boots.")
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(db_default=models.Value([], models.JSONField()))
    concurrency = models.IntegerField(db_default=1)
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())
    boot_id = models.CharField(
        max_length=255,
        blank=True,
        db_default="",
        help_text="What a liveness check saw of the worker's container, to notice restarts.",
    )
    pod = models.CharField(
        max_length=253,
        blank=True,
        db_default="",
        help_text="The worker's Kubernetes pod (POD_NAME), for liveness checks; empty elsewhere.",
    )
    tasks = models.JSONField(
        db_default=models.Value([], models.JSONField()),
        help_text="The task names this worker has registered.",
    )

    class Meta:
        db_table = "django_jobs_worker"
        ordering = ["name", "id"]
        indexes = [models.Index("name", name="worker_name_idx")]

    def __str__(self) -> str:
        return self.id
