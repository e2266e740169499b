"""What a job function sees of its own run, when its task has ``takes_context=True``."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import connections

from django_jobs import conf


@dataclasses.dataclass(frozen=True)
class JobContext:
    job_id: int
    task: str
    attempt: int
    max_attempts: int
    worker_id: str

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def is_cancelled(self) -> bool:
        """True once cancellation of this job was requested; long jobs may check it between steps
        and return early. The worker also stops the job by itself within a heartbeat interval."""
        with connections[conf.database_alias()].cursor() as cursor:
            cursor.execute(
                "SELECT cancel_requested OR state = 'cancelled' FROM django_jobs_job WHERE id = %s",
                [self.job_id],
            )
            row = cursor.fetchone()
        return bool(row and row[0])

    def spawn(self, task: Any, *args: Any, **kwargs: Any) -> Any:
        """Enqueue a child job of this job (``task`` is a ``@job`` function or its name).

        This job counts as finished only when all its children have: its function may return
        at once, and the job waits for them without holding a worker."""
        from django_jobs.registry import Task, registry

        resolved = task if isinstance(task, Task) else registry.get(task)
        return resolved.using(parent=self.job_id).enqueue(*args, **kwargs)

    def job(self) -> Any:
        """This job's row, freshly read."""
        from django_jobs.models import Job

        return Job.objects.using(conf.database_alias()).get(pk=self.job_id)
