"""What a running job, and the API serving its worker, read of one job: whether the run should
stop, whether it may spawn children, the job's task, and the HTTP API's view of it; and, for a
``--burst`` worker, when the next job becomes ready.

The statements are in django_jobs/store/sql/job_reads.sql.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.sql import query


class _Stop(NamedTuple):
    stop: bool


def stop_wanted(cursor: Cursor, job_id: int, lease: str | None) -> bool | None:
    """Whether the run of ``job_id`` under ``lease`` (None: a run without a lease) should stop:
    its cancellation was requested, or the run lost its lease. None if the job was deleted."""
    result = db.execute(cursor, query("stop_wanted"), {"id": job_id, "lease": lease})
    row = db.fetch_one_as(result, _Stop)
    return None if row is None else bool(row.stop)


#: Why a run should stop (:func:`stop_reason`).
CANCEL_REQUESTED = "cancel_requested"
LEASE_LOST = "lease_lost"


class _Reason(NamedTuple):
    reason: str | None


def stop_reason(cursor: Cursor, job_id: int, lease: str | None) -> str | None:
    """Why the run of ``job_id`` under ``lease`` should stop: :data:`LEASE_LOST` (also for a
    job that was deleted), :data:`CANCEL_REQUESTED`, or None if it should go on."""
    result = db.execute(cursor, query("stop_reason"), {"id": job_id, "lease": lease})
    row = db.fetch_one_as(result, _Reason)
    if row is None:
        return LEASE_LOST if lease is not None else None
    return row.reason


class SpawningParent(NamedTuple):
    """A job about to spawn a child, locked against its deletion until the child is committed."""

    state: str
    #: The token of its current claim, if it has one.
    lease: str | None
    cancel_requested: bool
    attempt: int
    worker_id: str | None


def lock_spawning_parent(cursor: Cursor, job_id: int) -> SpawningParent | None:
    """The job ``job_id``, locked ``FOR KEY SHARE`` for the rest of the caller's transaction; None
    if there is no such job."""
    result = db.execute(cursor, query("lock_spawning_parent"), {"id": job_id})
    return db.fetch_one_as(result, SpawningParent)


class _Queue(NamedTuple):
    id: int
    queue: str


def job_queues(cursor: Cursor, job_ids: Sequence[int]) -> dict[int, str]:
    """The queue of each of the jobs ``job_ids`` that exists."""
    result = db.execute(cursor, query("job_queues"), {"ids": list(job_ids)})
    return {row.id: row.queue for row in db.fetch_all_as(result, _Queue)}


class _Task(NamedTuple):
    task: str


def task_of_job(cursor: Cursor, job_id: int) -> str | None:
    """The task name of the job ``job_id``, or None if there is no such job."""
    row = db.fetch_one_as(db.execute(cursor, query("task_of_job"), {"id": job_id}), _Task)
    return None if row is None else row.task


class _Due(NamedTuple):
    seconds: float | None


def next_ready_within(
    cursor: Cursor, queues: Sequence[str] | None, skip_tasks: Sequence[str], within: float
) -> float | None:
    """Seconds until the next pending job of ``queues`` (None: all) in an open queue becomes
    ready, if one does within ``within`` seconds; else None."""
    params = {
        "queues": list(queues) if queues is not None else None,
        "skip_tasks": list(skip_tasks),
        "within": within,
    }
    row = db.fetch_one_as(db.execute(cursor, query("next_ready_within"), params), _Due)
    if row is None or row.seconds is None:
        return None
    return max(0.0, row.seconds)


@dataclasses.dataclass(frozen=True)
class JobView:
    """One job as the HTTP API's job view shows it (its steps are :func:`~django_jobs.store.
    job_steps`)."""

    id: int
    task: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    error: str
    cancel_requested: bool
    progress_done: float | None
    progress_total: float | None
    progress_message: str
    #: The job's cursors as JSON text, name -> {"value", "attempt", "saved_at"}; None: none.
    cursors: str | None


def job_view(cursor: Cursor, job_id: int) -> JobView | None:
    """The job ``job_id`` as the HTTP API's job view shows it; None if there is no such job."""
    return db.fetch_one_as(db.execute(cursor, query("job_view"), {"id": job_id}), JobView)


def rate_next_start(cursor: Cursor, rate_key: str | None, queue: str) -> datetime.datetime | None:
    """When a pending job of ``rate_key`` (or None) in ``queue`` may start, if a full rate
    window holds it back; None when none does."""
    row = db.execute(cursor, query("rate_next_start"), {"rate_key": rate_key, "queue": queue})
    return row.fetchone()[0]
