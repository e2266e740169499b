"""What each endpoint does in the database: plain synchronous functions, each run in a thread
of the API's pool (:mod:`django_jobs.api.thread_pool`) with that thread's connection.

They use the statements every worker uses (:mod:`django_jobs.store`), so a job claimed
over the API is fenced, reaped and retried like any other, and the enqueue of
:mod:`django_jobs.enqueue`, so a job enqueued over the API is checked like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import connections

from django_jobs import conf, store, workflows
from django_jobs.api.protocol import ApiError, Call, Finish, Step, lease_lost, option_field
from django_jobs.context import JobContext
from django_jobs.enqueue import missing_dependencies
from django_jobs.exceptions import (
    DependencyError,
    InvalidOption,
    InvalidPayload,
    SpawnRefused,
    UnknownTask,
)
from django_jobs.log_tail import stored_log
from django_jobs.progress import Progress
from django_jobs.registry import registry
from django_jobs.runtime import tracing
from django_jobs.sanitize import mask_text
from django_jobs.storable import storable_text
from django_jobs.store import Beat, ClaimedJob, Ended, Lease, WorkerInfo, claiming, job_reads
from django_jobs.tasks import Task
from django_jobs.tokens.auth import Grant

#: The longest error message and traceback kept of a finish, in characters: as a worker keeps
#: them (the start of an error, the end of a traceback).
ERROR_CHARS = 2000
TRACEBACK_CHARS = 20000


def stored_text(text: str) -> str:
    """Text a remote worker sent (an error, a traceback, a release reason, a progress message),
    as it is stored: masked and storable, on the server, whatever the client did."""
    return mask_text(storable_text(text)) if text else text


def _cursor() -> Any:
    return connections[conf.database_alias()].cursor()


class Registrations:
    """When this process last registered each API worker in the worker registry: a claim
    registers its worker (so that the reaper knows it) once per heartbeat interval, not once
    per claim."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[str, float] = {}

    def due(self, worker_id: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._at.get(worker_id, float("-inf")) < conf.heartbeat_interval():
                return False
            if len(self._at) > 100_000:
                self._at.clear()
            self._at[worker_id] = now
            return True

    def forget(self, worker_id: str) -> None:
        with self._lock:
            self._at.pop(worker_id, None)


registrations = Registrations()


def worker_info(
    worker_id: str, host: str, queues: Sequence[str] | None, /, **info: Any
) -> WorkerInfo:
    # Positional-only: a heartbeat's info also has "host" and "queues".
    return WorkerInfo(
        id=worker_id,
        name=str(info.get("name") or worker_id.split(":", 2)[2]),
        host=str(info.get("host") or host)[:255],
        pid=int(info.get("pid") or 0),
        queues=list(queues or []),
        concurrency=int(info.get("concurrency") or 1),
        pod=str(info.get("pod") or "")[:255],
        tasks=[str(t) for t in info.get("tasks") or []],
    )


@contextlib.contextmanager
def _registering(worker: WorkerInfo) -> Iterator[list[tuple[str, Any]]]:
    """The statement that registers ``worker`` when it is due (once per heartbeat interval),
    for a claim to send first in its own round trip and transaction; due again if that fails."""
    due = registrations.due(worker.id)
    try:
        yield [store.registration(worker)] if due else []
    except Exception:
        if due:
            registrations.forget(worker.id)
        raise


def claim(
    worker: WorkerInfo, queues: Sequence[str] | None, skip: Sequence[str]
) -> ClaimedJob | None:
    with _cursor() as cursor, _registering(worker) as first:
        # The claim's answer carries the job's steps and cursors, read in the same statement.
        return store.claim(cursor, worker.id, queues, skip, first=first, with_checkpoint=True)


def heartbeat(worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int]) -> Beat:
    with _cursor() as cursor:
        return store.heartbeat(cursor, worker, leases, unwritten)


def _finish_options(cursor: Any, lease: Lease, ending: Finish) -> dict[str, Any]:
    """The keyword arguments of :func:`django_jobs.store.finish` for ``ending``."""
    retry_delay = ending.retry_delay
    if retry_delay is None:
        retry_delay = 0.0
        if ending.outcome != "done" and ending.retryable:
            # As a worker of this app would: the task's backoff after this attempt.
            task = job_reads.task_of_job(cursor, lease.job_id)
            if task is not None:
                retry_delay = registry.backoff_for(task, lease.attempt)
    return {
        "result_json": ending.result_json,
        "error": stored_text(ending.error)[:ERROR_CHARS],
        "traceback": stored_text(ending.traceback)[-TRACEBACK_CHARS:],
        "retryable": ending.retryable,
        "retry_delay": retry_delay,
    }


def finish(lease: Lease, ending: Finish) -> Ended | None:
    with _cursor() as cursor:
        options = _finish_options(cursor, lease, ending)
        ended = store.finish(cursor, lease, ending.outcome, **options)
        if ended is not None and ended.needs_settling:
            workflows.settle(cursor, lease.job_id)
        return ended


def finish_then_claim(
    lease: Lease,
    ending: Finish,
    worker: WorkerInfo,
    queues: Sequence[str] | None,
    skip: Sequence[str],
) -> tuple[Ended | None, ClaimedJob | None]:
    """:func:`finish`, and in its transaction and round trip (with the worker's registration,
    when due, as :func:`claim` makes it) the claim of ``worker``'s next job, only if the finish
    matched the lease. Settling the finished job's workflow follows, in statements of its own."""
    with _cursor() as cursor:
        options = _finish_options(cursor, lease, ending)
        with _registering(worker) as first:
            ended, job = store.finish_then_claim(
                cursor,
                lease,
                ending.outcome,
                queues,
                skip,
                first=first,
                **options,
            )
        if ended is not None and ended.needs_settling:
            try:
                workflows.settle(cursor, lease.job_id)
            except Exception:
                # The request fails (the worker tries the finish again, and finds it recorded):
                # nobody would run the job claimed with it.
                if job is not None:
                    with contextlib.suppress(Exception):
                        store.release(cursor, job.lease, "its claim's answer failed")
                raise
        return ended, job


def release(lease: Lease, reason: str) -> bool:
    with _cursor() as cursor:
        return store.release(cursor, lease, stored_text(reason))


def record_live(
    lease: Lease,
    progress: Progress | None,
    log: str | None,
    cursors: dict[str, str] | None = None,
) -> store.Recorded:
    """Write a running attempt's progress, log and cursors (name -> the value's JSON text), fenced
    on all of its lease and only while it runs."""
    if progress is not None and progress.message:
        progress = dataclasses.replace(progress, message=stored_text(progress.message))
    if log is not None:
        # Cut as a worker cuts its tail, then masked: whatever the client sent.
        log = stored_log(log, conf.attempt_log_bytes())
    with _cursor() as cursor:
        return store.record_live(cursor, lease, progress, log, cursors=cursors, whole_lease=True)


@dataclasses.dataclass(frozen=True)
class StepAnswer:
    """A step's record: whether this request recorded it, and the result that stands, as JSON
    text (an earlier record's, when the name was recorded already)."""

    recorded: bool
    result_json: str


def record_step(lease: Lease, step: Step) -> StepAnswer | None:
    """Record ``step`` for the run of ``lease``, fenced on all of the lease; None if the lease
    is lost. A name recorded already (by an earlier attempt, or by this request sent again after
    its answer was lost) keeps its first result, which is answered."""
    with _cursor() as cursor:
        done = store.record_step(
            cursor, lease, step.name, step.result_json, step.duration, step.children
        )
        if not done.owner:
            return None
        if done.recorded:
            return StepAnswer(True, step.result_json)
        earlier = store.step_result(cursor, lease.job_id, step.name)
        return StepAnswer(False, step.result_json if earlier is None else earlier)


def job_view(job_id: int, grant: Grant) -> tuple[job_reads.JobView, list[store.StepInfo]] | None:
    """The job ``job_id`` and its recorded steps, for a token that holds its queue; None for a
    job that does not exist or that the token may not see (one answer for both)."""
    with _cursor() as cursor:
        job = job_reads.job_view(cursor, job_id)
        if job is None or not grant.holds(job.queue):
            return None
        return job, store.job_steps(cursor, job_id)


def attempt_outcome(lease: Lease) -> str | None:
    with _cursor() as cursor:
        return store.attempt_outcome(cursor, lease)


def _task(call: Call, grant: Grant) -> Task:
    """The task of an enqueue or a spawn, with its options, within what ``grant`` allows: its
    tasks, its queues (for a ``*`` token, the declared ones) and, for ``depends_on``, the jobs of
    its queues (any other job is answered as one that does not exist)."""
    if not grant.may_enqueue_task(call.task):
        raise ApiError(
            403,
            f"this token may not enqueue task {call.task!r}; its tasks are "
            f"{', '.join(grant.tasks)} (createjobtoken --tasks)",
            "task",
        )
    try:
        task = registry.get(call.task)
    except UnknownTask as error:
        raise ApiError(400, str(error), "task") from None
    try:
        task = task.using(**call.options) if call.options else task
    except InvalidOption as error:
        raise ApiError(400, str(error), option_field(str(error))) from None
    if not grant.may_enqueue_to(task.queue):
        hint = (
            " (a * token enqueues into the queues the settings declare: JOBS_QUEUES, else the "
            "default queue and those of registered tasks)"
            if grant.all_queues
            else ""
        )
        raise ApiError(403, f"this token may not enqueue into queue {task.queue!r}{hint}", "queue")
    _check_dependencies(task, grant)
    return task


def _check_dependencies(task: Task, grant: Grant) -> None:
    ids = [dep for dep in task.depends_on if isinstance(dep, int)]
    if not ids:
        return
    with _cursor() as cursor:  # an id out of bigint's range names no job
        queues = job_reads.job_queues(cursor, [i for i in ids if 0 < i < 2**63])
    hidden = sorted({i for i in ids if i not in queues or not grant.holds(queues[i])})
    if hidden:
        error = missing_dependencies(hidden)
        raise ApiError(400, str(error), option_field(str(error)))


def enqueue(call: Call, grant: Grant, trace_context: dict[str, str] | None = None) -> Any:
    """The job of an enqueue, in the request's trace context (its W3C headers), if it has one."""
    task = _task(call, grant)
    try:
        with tracing.within(trace_context):
            return task.enqueue(*call.args, **call.kwargs)
    except (InvalidPayload, InvalidOption, DependencyError) as error:
        raise ApiError(400, str(error), option_field(str(error))) from None


def spawn(
    lease: Lease, call: Call, grant: Grant, trace_context: dict[str, str] | None = None
) -> Any:
    """A child of the job of ``lease``, enqueued only while all of the lease holds (job,
    attempt, token and worker) and the job is not being cancelled; else the one generic 409
    of a lost lease, which says nothing of the job. In the request's trace context (the run
    that spawns it, whose worker sends its W3C headers), if it has one."""
    task = _task(call, grant)
    run = JobContext(
        job_id=lease.job_id,
        task="",
        attempt=lease.attempt,
        max_attempts=0,
        worker_id=lease.worker_id,
        lease=lease.token,
    )
    try:
        with tracing.within(trace_context):
            return run.spawn(task, *call.args, **call.kwargs)
    except SpawnRefused:
        raise lease_lost() from None
    except (InvalidPayload, InvalidOption, DependencyError) as error:
        raise ApiError(400, str(error), option_field(str(error))) from None


def ready_queues(queues: Sequence[str], any_queue: bool) -> set[str]:
    """Which of ``queues`` have a ready job (``""``: any queue, when ``any_queue``): the hint
    that wakes idle long polls (api/waiting.py)."""
    with _cursor() as cursor:
        return claiming.ready_queues(cursor, queues, any_queue)
