"""What each endpoint does in the database: plain synchronous functions, each run in a thread
of the API's pool (:mod:`django_jobs.api.thread_pool`) with that thread's connection.

They use the statements every worker uses (:mod:`django_jobs.store`), so a job claimed
over the API is fenced, reaped and retried like any other, and the enqueue of
:mod:`django_jobs.enqueue`, so a job enqueued over the API is checked like any other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import connections

from django_jobs import conf, store, workflows
from django_jobs.api.protocol import ApiError, Call, Finish, option_field
from django_jobs.context import JobContext
from django_jobs.exceptions import (
    DependencyError,
    InvalidOption,
    InvalidPayload,
    SpawnRefused,
    UnknownTask,
)
from django_jobs.progress import Progress
from django_jobs.registry import registry
from django_jobs.store import Beat, ClaimedJob, Ended, Lease, WorkerInfo, claiming, job_reads
from django_jobs.tasks import Task


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


def claim(
    worker: WorkerInfo, queues: Sequence[str] | None, skip: Sequence[str]
) -> ClaimedJob | None:
    with _cursor() as cursor:
        if registrations.due(worker.id):
            try:
                store.heartbeat(cursor, worker, [], [])
            except Exception:
                registrations.forget(worker.id)
                raise
        return store.claim(cursor, worker.id, queues, skip)


def heartbeat(worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int]) -> Beat:
    with _cursor() as cursor:
        return store.heartbeat(cursor, worker, leases, unwritten)


def finish(lease: Lease, ending: Finish) -> Ended | None:
    with _cursor() as cursor:
        retry_delay = ending.retry_delay
        if retry_delay is None:
            retry_delay = 0.0
            if ending.outcome != "done" and ending.retryable:
                # As a worker of this app would: the task's backoff after this attempt.
                task = job_reads.task_of_job(cursor, lease.job_id)
                if task is not None:
                    retry_delay = registry.backoff_for(task, lease.attempt)
        ended = store.finish(
            cursor,
            lease,
            ending.outcome,
            result_json=ending.result_json,
            error=ending.error,
            traceback=ending.traceback,
            retryable=ending.retryable,
            retry_delay=retry_delay,
        )
        if ended is not None and ended.needs_settling:
            workflows.settle(cursor, lease.job_id)
        return ended


def release(lease: Lease, reason: str) -> bool:
    with _cursor() as cursor:
        return store.release(cursor, lease, reason)


def record_live(lease: Lease, progress: Progress | None, log: str | None) -> store.Recorded:
    with _cursor() as cursor:
        return store.record_live(cursor, lease, progress, log)


def attempt_outcome(lease: Lease) -> str | None:
    with _cursor() as cursor:
        return store.attempt_outcome(cursor, lease)


def _task(call: Call, held: Any) -> Task:
    try:
        task = registry.get(call.task)
    except UnknownTask as error:
        raise ApiError(400, str(error), "task") from None
    try:
        task = task.using(**call.options) if call.options else task
    except InvalidOption as error:
        raise ApiError(400, str(error), option_field(str(error))) from None
    if not held(task.queue):
        raise ApiError(403, f"this token does not hold queue {task.queue!r}", "queue")
    return task


def enqueue(call: Call, held: Any) -> Any:
    task = _task(call, held)
    try:
        return task.enqueue(*call.args, **call.kwargs)
    except (InvalidPayload, InvalidOption, DependencyError) as error:
        raise ApiError(400, str(error), option_field(str(error))) from None


def spawn(lease: Lease, call: Call, held: Any) -> Any:
    task = _task(call, held)
    run = JobContext(
        job_id=lease.job_id,
        task="",
        attempt=lease.attempt,
        max_attempts=0,
        worker_id=lease.worker_id,
        lease=lease.token,
    )
    try:
        return run.spawn(task, *call.args, **call.kwargs)
    except SpawnRefused as error:
        raise ApiError(409, str(error), "lease") from None
    except (InvalidPayload, InvalidOption, DependencyError) as error:
        raise ApiError(400, str(error), option_field(str(error))) from None


def ready_queues(queues: Sequence[str], any_queue: bool) -> set[str]:
    """Which of ``queues`` have a ready job (``""``: any queue, when ``any_queue``): the hint
    that wakes idle long polls (api/waiting.py)."""
    with _cursor() as cursor:
        return claiming.ready_queues(cursor, queues, any_queue)
