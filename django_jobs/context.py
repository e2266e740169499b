"""What a job function sees of its own run, when its task has ``takes_context=True``."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_jobs import conf
from django_jobs.exceptions import SpawnRefused
from django_jobs.progress import BadProgress, Progress, checked
from django_jobs.store import db, job_reads

#: The job's own logger (its records are captured with the job's log, see worker/capture.py).
logger = logging.getLogger("django_jobs.job")


@dataclasses.dataclass(frozen=True)
class JobContext:
    job_id: int
    task: str
    attempt: int
    max_attempts: int
    worker_id: str
    #: The token of the claim this run belongs to (see store.Lease).
    lease: str | None = None
    #: Where :meth:`progress` sends a report: the executor's pipe to its supervisor.
    report_progress: Callable[[Progress], None] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Report how far this run has come: ``done`` of ``total`` (``None``: unknown), with a
        short ``message``. Cheap enough to call per item (a few µs): the call keeps
        the latest value, which the executor sends to its worker at most every 20 ms; the
        worker writes it at most once per ``JOBS_PROGRESS_INTERVAL``, and the last value when
        the attempt ends.

        It never raises: a ``done`` below 0 counts as 0, past ``total`` as ``total``; a message
        is cut at 500 characters; a ``done`` or ``total`` that is not a finite number changes
        nothing, and a warning says so in the job's log."""
        try:
            value = checked(self.job_id, done, total, message)
        except BadProgress as exc:
            logger.warning("job %d: %s; the report was ignored", self.job_id, exc)
            return
        if self.report_progress is not None:
            try:  # not contextlib.suppress, which costs a few tenths of a µs a call
                self.report_progress(value)
            except OSError:  # the supervisor is gone; the job goes on
                return

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def is_cancelled(self) -> bool:
        """True once cancellation of this job was requested, or once this run lost its lease (the
        job was reaped, re-claimed or deleted: another run owns it now, or none should). Long jobs
        may check it between steps and return early; the worker also stops the job by itself
        within a heartbeat interval. On a worker of the HTTP API it asks the API."""
        api = self._api()
        if api is not None:
            status, answer = api.post(f"v1/jobs/{self.job_id}/heartbeat", {"lease": self.lease})
            return status != 200 or bool(answer.get("cancel_requested"))
        with connections[conf.database_alias()].cursor() as cursor:
            stop = job_reads.stop_wanted(cursor, self.job_id, self.lease)
        if stop is None:
            return self.lease is not None  # deleted under a running job
        return stop

    def spawn(self, task: Any, *args: Any, **kwargs: Any) -> Any:
        """Enqueue a child job of this job (``task`` is a ``@job`` function or its name).

        This job counts as finished only when all the children of its final attempt have: its
        function may return at once, and the job waits for them without holding a worker.
        Raises :class:`~django_jobs.exceptions.SpawnRefused`, and creates nothing, once this
        job's cancellation was requested or this run lost its lease."""
        from django_jobs.registry import registry

        resolved = registry.get(task) if isinstance(task, str) else task
        api = self._api()
        if api is not None:
            return self._spawn_over(api, resolved, args, kwargs)
        alias = conf.database_alias()
        with db.atomic(alias):
            self._check_may_spawn(alias)
            return resolved.using(parent=self.job_id).enqueue(*args, **kwargs)

    def _api(self) -> Any:
        """The HTTP API this run's worker takes its jobs from, or None (a worker of the job
        database). Its leases are the API's, not tokens of the job table."""
        from django_jobs import apiclient

        return apiclient.from_environment() if self.lease and "." in self.lease else None

    def _spawn_over(self, api: Any, task: Any, args: Any, kwargs: Any) -> Any:
        """:meth:`spawn` over the API: the server checks and enqueues the child as it would
        here, and answers its id; the :class:`~django_jobs.models.Job` returned holds what the
        answer says (id, task, queue, state), not a fresh read of the row."""
        from django_jobs.exceptions import InvalidOption
        from django_jobs.models.job import Job

        options: dict[str, Any] = {
            "queue": task.queue,
            "priority": task.priority,
            "max_attempts": task.max_attempts,
            "timeout": task.timeout,
            "unique_key": task.unique_key,
            "concurrency_key": task.concurrency_key,
            "concurrency_limit": task.concurrency_limit,
        }
        if isinstance(task.run_after, datetime.timedelta):
            options["delay"] = task.run_after.total_seconds()
        elif task.run_after is not None:
            options["run_after"] = task.run_after.isoformat()
        if task.depends_on:
            options["depends_on"] = [getattr(d, "pk", d) for d in task.depends_on]
        body = {
            "lease": self.lease,
            "task": task.name,
            "args": list(args),
            "kwargs": dict(kwargs),
            "options": {k: v for k, v in options.items() if v is not None},
        }
        status, answer = api.post(f"v1/jobs/{self.job_id}/spawn", body)
        if status == 409 or status == 404:
            raise SpawnRefused(
                f"job {self.job_id} cannot spawn children: {(answer or {}).get('error', status)}"
            )
        if status != 201:
            raise InvalidOption(f"the API refused the child job: {answer}")
        child = answer["job"]
        return Job(
            pk=child["id"],
            task=child["task"],
            queue=child["queue"],
            state=child["state"],
            parent_id=self.job_id,
        )

    def _check_may_spawn(self, alias: str) -> None:
        # A cancel that commits after this check is caught when this attempt ends: the settling
        # cancels the children it spawned (workflows.py).
        with connections[alias].cursor() as cursor:
            parent = job_reads.lock_spawning_parent(cursor, self.job_id)
        if parent is None:
            raise SpawnRefused(f"job {self.job_id} no longer exists; it cannot spawn children")
        if self.lease is not None and (
            parent.state != "running"
            or parent.lease != self.lease
            or parent.attempt != self.attempt
            or parent.worker_id != self.worker_id
        ):
            raise SpawnRefused(
                f"job {self.job_id} attempt {self.attempt} lost its lease (the job is"
                f" {parent.state} under another run); it cannot spawn children and should stop"
            )
        if parent.cancel_requested or parent.state == "cancelled":
            raise SpawnRefused(
                f"job {self.job_id} is being cancelled; it cannot spawn children and should stop"
            )

    def job(self) -> Any:
        """This job's row, freshly read."""
        from django_jobs.models.job import Job

        return Job.objects.using(conf.database_alias()).get(pk=self.job_id)
