"""The statements of the hourly rollups (django_jobs/rollups.py), in
django_jobs/store/sql/rollups.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.states import FAILED_OUTCOMES
from django_jobs.store import db
from django_jobs.store.sql import query


class Span(NamedTuple):
    """Where the rollups stand: every hour before ``rolled_until`` is rolled up (None: none
    yet); hours before ``closed_until`` may be; ``earliest``: before the first pass, the
    earliest finish on record; ``pass_end``: where a pass from the watermark would end (None:
    no hour is due)."""

    rolled_until: datetime | None
    closed_until: datetime
    earliest: datetime | None
    pass_end: datetime | None


class Rolled(NamedTuple):
    """What one pass wrote: ``advanced`` 0 when another pass had moved the watermark first."""

    advanced: int
    rows: int
    totals: int


class TaskDay(NamedTuple):
    """A task's rollups summed over one UTC day and outcome; ``buckets``: for the outcome done,
    its successful attempts' buckets over the whole period (the same on each of its days)."""

    task: str
    day: date
    outcome: str
    jobs: int
    attempts: int
    seconds: float
    buckets: list[int]
    today: date


class HourCounts(NamedTuple):
    """Attempts ended in one UTC hour, summed over queues and tasks."""

    hour: datetime
    done: int
    failed: int


class _Deleted(NamedTuple):
    deleted: int


class _Watermark(NamedTuple):
    rolled_until: datetime | None


def bucket_params(bounds: Sequence[float]) -> dict[str, list[float]]:
    """The statements' parameters for the buckets of ``bounds``."""
    return {"bounds": list(bounds), "negated_bounds": sorted(-bound for bound in bounds)}


def span(cursor: Cursor, delay: timedelta, length: timedelta = timedelta(hours=24)) -> Span:
    """Where the rollups stand, and where a pass of at most ``length`` would end."""
    params = {"delay": delay, "span": length}
    found = db.fetch_one_as(db.execute(cursor, query("rollup_span"), params), Span)
    assert found is not None  # a SELECT from VALUES has one row
    return found


def roll_up(
    cursor: Cursor, start: datetime | None, end: datetime, bounds: Sequence[float]
) -> Rolled:
    """Roll up the hours in [``start``, ``end``) if the watermark is still at ``start``."""
    params = {"from": start, "to": end, **bucket_params(bounds)}
    rolled = db.fetch_one_as(db.execute(cursor, query("roll_up"), params), Rolled)
    assert rolled is not None  # a SELECT without FROM has one row
    return rolled


def rolled_until(cursor: Cursor) -> datetime | None:
    found = db.fetch_one_as(db.execute(cursor, query("rolled_until")), _Watermark)
    return None if found is None else found.rolled_until


def prune(cursor: Cursor, age: timedelta, batch_size: int) -> int:
    """Delete up to ``batch_size`` hourly rows older than ``age``; how many went."""
    params = {"age": age, "batch_size": batch_size}
    gone = db.fetch_one_as(db.execute(cursor, query("prune_rollups"), params), _Deleted)
    assert gone is not None  # a count has one row
    return gone.deleted


def task_days(cursor: Cursor, days: int, tasks: int) -> list[TaskDay]:
    """The days (the last ``days``, today included) by outcome of the ``tasks`` tasks that
    ended the most jobs in them."""
    params = {"days": days, "tasks": tasks}
    return db.fetch_all_as(db.execute(cursor, query("task_days"), params), TaskDay)


def hourly_attempts(cursor: Cursor, since: datetime) -> list[HourCounts]:
    """The attempts done and failed in each rolled-up hour from ``since`` on, oldest first."""
    params = {"since": since, "failed": sorted(FAILED_OUTCOMES)}
    return db.fetch_all_as(db.execute(cursor, query("hourly_attempts"), params), HourCounts)
