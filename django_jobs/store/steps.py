"""A long job's checkpoint: the results of its completed steps and the values of its cursors,
kept across its attempts (``context.step()``, ``context.save_cursor()``).

The statements are in django_jobs/store/sql/steps.sql, and a cursor is written by
``record_live`` (progress.sql), with the run's progress. Every write is fenced on the run's
lease: a run that lost it records nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.claiming import Lease, lease_params
from django_jobs.store.sql import query


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a run resumes from: each recorded step's result and each cursor's value, by name,
    as JSON text (decoded when a step or cursor is asked for, so that a job that reads one
    decodes only that one)."""

    steps: dict[str, str] = dataclasses.field(default_factory=dict)
    cursors: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, steps: dict[str, Any] | None, cursors: dict[str, Any] | None) -> Checkpoint:
        """From decoded values (the HTTP API's answer)."""
        return cls(
            {name: json.dumps(value) for name, value in (steps or {}).items()},
            {name: json.dumps(value) for name, value in (cursors or {}).items()},
        )

    def decoded(self) -> dict[str, dict[str, Any]]:
        """``{"steps": {...}, "cursors": {...}}`` with the values decoded: the HTTP API's form."""
        return {
            "steps": {name: json.loads(text) for name, text in self.steps.items()},
            "cursors": {name: json.loads(text) for name, text in self.cursors.items()},
        }


class _Texts(NamedTuple):
    steps: str | None
    cursors: str | None


def _split(text: str | None) -> dict[str, str]:
    """A JSON object's members as JSON texts of their own."""
    if text is None:
        return {}
    return {name: json.dumps(value) for name, value in json.loads(text).items()}


def checkpoint(cursor: Cursor, job_id: int) -> Checkpoint:
    """The recorded steps and the cursors of ``job_id`` (empty if it has none, or is gone)."""
    row = db.fetch_one_as(db.execute(cursor, query("checkpoint"), {"job_id": job_id}), _Texts)
    assert row is not None  # a SELECT without FROM has one row
    return Checkpoint(_split(row.steps), _split(row.cursors))


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


def clear_checkpoint(cursor: Cursor, job_ids: Sequence[int]) -> None:
    """Forget the steps and cursors of ``job_ids``, which a retry has just made pending, in that
    retry's transaction (an operator's "retry from the start")."""
    if job_ids:
        db.execute(cursor, query("clear_checkpoint"), {"ids": list(job_ids)})
