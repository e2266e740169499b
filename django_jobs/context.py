"""What a job function sees of its own run, when its task has ``takes_context=True``."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import connections, transaction

from django_jobs import conf, db
from django_jobs.exceptions import SpawnRefused


@dataclasses.dataclass(frozen=True)
class JobContext:
    job_id: int
    task: str
    attempt: int
    max_attempts: int
    worker_id: str
    #: The token of the claim this run belongs to (see transitions.Lease).
    lease: str | None = None

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def is_cancelled(self) -> bool:
        """True once cancellation of this job was requested, or once this run lost its lease (the
        job was reaped, re-claimed or deleted: another run owns it now, or none should). Long jobs
        may check it between steps and return early; the worker also stops the job by itself
        within a heartbeat interval."""
        with connections[conf.database_alias()].cursor() as cursor:
            cursor.execute(
                "SELECT cancel_requested OR state = 'cancelled'"
                " OR (%(lease)s::uuid IS NOT NULL"
                "     AND (state <> 'running' OR lease IS DISTINCT FROM %(lease)s::uuid))"
                " FROM django_jobs_job WHERE id = %(id)s",
                {"id": self.job_id, "lease": self.lease},
            )
            row = cursor.fetchone()
        if row is None:
            return self.lease is not None  # deleted under a running job
        return bool(row[0])

    def spawn(self, task: Any, *args: Any, **kwargs: Any) -> Any:
        """Enqueue a child job of this job (``task`` is a ``@job`` function or its name).

        This job counts as finished only when all the children of its final attempt have: its
        function may return at once, and the job waits for them without holding a worker.
        Raises :class:`~django_jobs.exceptions.SpawnRefused`, and creates nothing, once this
        job's cancellation was requested or this run lost its lease."""
        from django_jobs.registry import Task, registry

        resolved = task if isinstance(task, Task) else registry.get(task)
        alias = conf.database_alias()
        with transaction.atomic(using=alias):
            self._check_may_spawn(alias)
            return resolved.using(parent=self.job_id).enqueue(*args, **kwargs)

    def _check_may_spawn(self, alias: str) -> None:
        # FOR KEY SHARE, as the child's foreign key takes it: it waits for nobody that only
        # updates the job (a finish, a cancel), and keeps the row from being deleted until the
        # child is committed. A cancel that commits after this check is caught when this
        # attempt ends: the settling cancels the children it spawned (workflows.py).
        with connections[alias].cursor() as cursor:
            row = db.execute(
                cursor,
                "SELECT state, lease::text, cancel_requested FROM django_jobs_job"
                " WHERE id = %s FOR KEY SHARE",
                [self.job_id],
            ).fetchone()
        if row is None:
            raise SpawnRefused(f"job {self.job_id} no longer exists; it cannot spawn children")
        state, lease, cancel_requested = row
        if self.lease is not None and (state != "running" or lease != self.lease):
            raise SpawnRefused(
                f"job {self.job_id} attempt {self.attempt} lost its lease (the job is {state}"
                " under another run); it cannot spawn children and should stop"
            )
        if cancel_requested or state == "cancelled":
            raise SpawnRefused(
                f"job {self.job_id} is being cancelled; it cannot spawn children and should stop"
            )

    def job(self) -> Any:
        """This job's row, freshly read."""
        from django_jobs.models import Job

        return Job.objects.using(conf.database_alias()).get(pk=self.job_id)
