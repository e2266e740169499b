"""A long job's checkpoint: the results of its completed steps and the values of its cursors,
kept across its attempts (``context.step()``, ``context.save_cursor()``).

The statements are in django_jobs/store/sql/steps.sql, and a cursor is written by
``record_live`` (progress.sql), with the run's progress. Every write is fenced on the run's
lease: a run that lost it records nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.claiming import Checkpoint, Lease, lease_params
from django_jobs.store.sql import query


class _Texts(NamedTuple):
    steps: str | None
    cursors: str | None


def checkpoint(cursor: Cursor, job_id: int) -> Checkpoint:
    """The recorded steps and the cursors of ``job_id`` (empty if it has none, or is gone)."""
    row = db.fetch_one_as(db.execute(cursor, query("checkpoint"), {"job_id": job_id}), _Texts)
    assert row is not None  # a SELECT without FROM has one row
    return Checkpoint.of_texts(row.steps, row.cursors)


class StepRecord(NamedTuple):
    """What :func:`record_step` found: whether the lease still owned the job, whether this call
    recorded the step, how many children it made the job's own, and the result as recorded
    (JSON text as the database gives it back to every later attempt; None if not recorded)."""

    owner: bool
    recorded: bool
    adopted: int
    result: str | None = None


def record_step(
    cursor: Cursor,
    lease: Lease,
    name: str,
    result_json: str,
    duration: float,
    children: Sequence[int] = (),
) -> StepRecord:
    """Record the step ``name`` of the run of ``lease``, with its result (JSON text), durably.
    ``children``: the ids of the children the step spawned."""
    params = {
        **lease_params(lease),
        "name": name,
        "result": result_json,
        "result_bytes": len(result_json.encode()),
        "duration": max(0.0, float(duration)),
        "children": list(children),
    }
    row = db.fetch_one_as(db.execute(cursor, query("record_step"), params), StepRecord)
    assert row is not None
    return row


class _Result(NamedTuple):
    result: str


def step_result(cursor: Cursor, job_id: int, name: str) -> str | None:
    """The recorded result of step ``name`` of ``job_id``, as JSON text; None if none is."""
    result = db.execute(cursor, query("step_result"), {"job_id": job_id, "name": name})
    row = db.fetch_one_as(result, _Result)
    return None if row is None else row.result


class _Owner(NamedTuple):
    owner: bool


def owns_lease(cursor: Cursor, lease: Lease) -> bool:
    """Whether the job of ``lease`` is running under that very claim."""
    row = db.fetch_one_as(db.execute(cursor, query("owns_lease"), lease_params(lease)), _Owner)
    return bool(row and row.owner)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """A recorded step as its job's page shows it: not its result, only the result's size."""

    name: str
    attempt: int
    recorded_at: datetime.datetime
    duration: float
    result_bytes: int


def job_steps(cursor: Cursor, job_id: int) -> list[StepInfo]:
    """The recorded steps of ``job_id``, in the order they were recorded."""
    return db.fetch_all_as(db.execute(cursor, query("job_steps"), {"job_id": job_id}), StepInfo)


@dataclasses.dataclass(frozen=True)
class LatestSteps:
    """The last steps a job recorded, in the order they were recorded, and how many it has."""

    steps: list[StepInfo]
    total: int

    @property
    def left_out(self) -> int:
        """The job's steps recorded before the first of :attr:`steps`."""
        return self.total - len(self.steps)


class _CountedStep(NamedTuple):
    name: str
    attempt: int
    recorded_at: datetime.datetime
    duration: float
    result_bytes: int
    total: int


def latest_steps(cursor: Cursor, job_id: int, limit: int) -> LatestSteps:
    """The last ``limit`` steps of ``job_id`` (all of them if it has no more), in the order they
    were recorded, with the number of steps it has in all: one statement, however many."""
    result = db.execute(cursor, query("latest_steps"), {"job_id": job_id, "limit": limit})
    rows = db.fetch_all_as(result, _CountedStep)
    steps = [StepInfo(*row[:-1]) for row in reversed(rows)]
    return LatestSteps(steps, rows[0].total if rows else 0)


def clear_checkpoint(cursor: Cursor, job_ids: Sequence[int]) -> None:
    """Forget the steps and cursors of ``job_ids``, which a retry has just made pending, in that
    retry's transaction (an operator's "retry from the start")."""
    if job_ids:
        db.execute(cursor, query("clear_checkpoint"), {"ids": list(job_ids)})
