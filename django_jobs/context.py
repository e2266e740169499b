"""What a job function sees of its own run, when its task has ``takes_context=True``: its
attempt and lease, its progress, cancellation, children, and the steps and cursors that let a
long job resume where an interrupted attempt stopped (django_jobs/steps/)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_jobs import conf
from django_jobs.exceptions import Cancelled, SpawnRefused
from django_jobs.progress import BadProgress, Progress, checked
from django_jobs.steps.run import ApiDoor, DatabaseDoor, RunCheckpoint, lease_lost
from django_jobs.store import Checkpoint, Lease, db, job_reads

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
    #: Where :meth:`save_cursor` sends a cursor in an executor (its worker writes it); None:
    #: each save is written at once.
    report_cursor: Callable[[str, str], None] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    #: The checkpoint the claim brought (a worker of the HTTP API); None: read when needed.
    checkpoint: Checkpoint | None = dataclasses.field(default=None, repr=False, compare=False)
    _run: list[RunCheckpoint] = dataclasses.field(
        default_factory=list, init=False, repr=False, compare=False
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

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~django_jobs.Cancelled` once this job's cancellation was requested, and
        :class:`~django_jobs.LeaseLost` once this run lost its lease; else return. One cheap
        query (on a worker of the HTTP API, one request): call it between items or steps. A job
        that lets ``Cancelled`` propagate ends ``cancelled``, its attempt too."""
        api = self._api()
        if api is not None:
            status, answer = api.post(f"v1/jobs/{self.job_id}/heartbeat", {"lease": self.lease})
            if status != 200:
                raise lease_lost(self._lease(), "the cancellation check")
            if answer.get("cancel_requested"):
                raise Cancelled(f"job {self.job_id}: cancellation was requested")
            return
        with connections[conf.database_alias()].cursor() as cursor:
            stop = job_reads.stop_reason(cursor, self.job_id, self.lease)
        if stop == job_reads.CANCEL_REQUESTED:
            raise Cancelled(f"job {self.job_id}: cancellation was requested")
        if stop is not None:
            raise lease_lost(self._lease(), "the cancellation check")

    # ------------------------------------------------------------------ steps and cursors

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the step ``name`` of this job, once across all its
        attempts: the first attempt that completes it records its JSON result, durably and
        fenced on this run's lease, before this call returns; every later attempt (after a
        failure and retry, a crash and a reap, a release at shutdown) gets the recorded result
        back without calling ``fn``. The result is returned as JSON gives it back (a tuple as a
        list), the same on every attempt.

        A name is unique within a job: using one twice in one attempt raises
        :class:`~django_jobs.StepError`, and so does a step inside another. A result that is
        not plain JSON, or larger than ``JOBS_MAX_PAYLOAD_BYTES``, raises
        :class:`~django_jobs.InvalidStepResult` and is not recorded. Children spawned by ``fn``
        are the step's: a retry that replays past the step does not spawn them again. Raises
        :class:`~django_jobs.LeaseLost`, recording nothing, if this run lost its lease."""
        return self._checkpoint().step(name, fn, args, kwargs)

    def cursor(self, name: str, default: Any = None) -> Any:
        """The value last saved for the cursor ``name`` by any attempt of this job
        (:meth:`save_cursor`), or ``default`` if none was."""
        return self._checkpoint().cursor(name, default)

    def save_cursor(self, name: str, value: Any) -> None:
        """Save ``value`` (plain JSON, at most ``JOBS_MAX_PAYLOAD_BYTES``, and so are all of the
        job's cursors together) as the cursor ``name``, for a later attempt to resume from:
        fenced on this run's lease, and cheap enough to call per item. In a worker the newest
        values are written with the run's progress, at most once per ``JOBS_CURSOR_INTERVAL``
        (0.05 s), and always before the attempt's end or its release at shutdown; a worker
        killed outright loses at most the saves of that interval, so a resumed loop may redo
        the last few items. Raises
        :class:`~django_jobs.InvalidStepResult` for a value that cannot be saved, and
        :class:`~django_jobs.LeaseLost` where the save is written at once and the run lost its
        lease."""
        self._checkpoint().save_cursor(name, value)

    def is_owner(self) -> bool:
        """Whether this run still owns its job: the job is running this very claim (one cheap
        query, or one request to the HTTP API). Check it before a write to another system that
        must not race a later run; or, better, pass :attr:`lease` along as a fencing token."""
        if self.lease is None:
            return True  # a run without a claim (called directly): nobody else can own it
        return self._checkpoint().door.is_owner()

    def _lease(self) -> Lease:
        return Lease(self.job_id, self.attempt, self.worker_id, self.lease)

    def _checkpoint(self) -> RunCheckpoint:
        if not self._run:
            api = self._api()
            door: Any
            if api is not None:
                assert self.lease is not None
                door = ApiDoor(api, self.job_id, self.lease, self.checkpoint)
            else:
                door = DatabaseDoor(self._lease())
            self._run.append(RunCheckpoint(door, self.report_cursor))
        return self._run[0]

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
            child = resolved.using(parent=self.job_id).enqueue(*args, **kwargs)
        if self._run:
            self._run[0].spawned_child(child.pk)
        return child

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
            "rate_key": task.rate_key,
            "rate_limit": task.rate_limit,
            "expires_at": None if task.expires_at is None else task.expires_at.isoformat(),
            "expires_after": (
                task.expires_after.total_seconds()
                if isinstance(task.expires_after, datetime.timedelta)
                else task.expires_after
            ),
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
        if self._run:
            self._run[0].spawned_child(child["id"])
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
