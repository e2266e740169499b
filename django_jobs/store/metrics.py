"""The statements of the Prometheus endpoint (django_jobs/metrics/), in
django_jobs/store/sql/metrics.sql. Each returns plain rows; the endpoint shapes them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.rollups import bucket_params
from django_jobs.store.sql import query

Row = TypeVar("Row")


class QueueRow(NamedTuple):
    queue: str
    pending: int
    running: int
    waiting: int
    ready: int
    scheduled: int
    oldest_ready_age_seconds: float
    live_workers: int
    paused: bool
    concurrency_limit: int | None


class WorkersRow(NamedTuple):
    alive: bool
    workers: int
    slots: int
    running_jobs: int


class FinishedRow(NamedTuple):
    """One row of ``metrics_finished``: ``kind`` is 'total', 'jobs' or 'attempts'."""

    kind: str
    queue: str
    task: str
    outcome: str
    jobs: int
    attempts: int
    seconds: float
    bucket: int | None
    buckets: list[int] | None
    waited_jobs: int
    wait_seconds: float


class RollupsRow(NamedTuple):
    rolled_until: datetime | None
    lag_seconds: float | None


class ScheduleRow(NamedTuple):
    name: str
    task: str
    #: Unix times, as PostgreSQL reckons them (no time zone of Python's involved).
    next_run_epoch: float | None
    late_seconds: float
    last_success_epoch: float | None


class AlertRow(NamedTuple):
    kind: str
    subject: str
    severity: str


def _all(cursor: Cursor, name: str, row: type[Row], params: Any = None) -> list[Row]:
    return db.fetch_all_as(db.execute(cursor, query(name), params), row)


def queues(cursor: Cursor) -> list[QueueRow]:
    return _all(cursor, "metrics_queues", QueueRow)


def workers(cursor: Cursor) -> list[WorkersRow]:
    return _all(cursor, "metrics_workers", WorkersRow)


def finished(cursor: Cursor, bounds: Sequence[float], since: datetime | None) -> list[FinishedRow]:
    """The counts; ``since``: the watermark as :func:`rollups` read it (None: none yet)."""
    params = {**bucket_params(bounds), "since": since or "-infinity"}
    return _all(cursor, "metrics_finished", FinishedRow, params)


def rollups(cursor: Cursor) -> RollupsRow:
    (row,) = _all(cursor, "metrics_rollups", RollupsRow)
    return row


def schedules(cursor: Cursor) -> list[ScheduleRow]:
    return _all(cursor, "metrics_schedules", ScheduleRow)


def alerts(cursor: Cursor) -> list[AlertRow]:
    return _all(cursor, "metrics_alerts", AlertRow)
