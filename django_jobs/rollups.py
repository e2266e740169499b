"""Hourly rollups: finished jobs and ended attempts summed per UTC hour, queue, task and outcome,
kept after ``prunejobs`` has deleted the jobs (tables of :mod:`django_jobs.models.rollup`).

An hour is rolled up once it ended more than :data:`ROLLUP_DELAY` ago, by whichever comes
first: a worker's periodic pass (every ``JOBS_ROLLUP_INTERVAL`` seconds it looks whether an hour
is due: one read of one row), ``manage.py rollupjobs``, or ``manage.py prunejobs``, which rolls
up before it deletes and never deletes a job finished after the watermark. Each pass is one
statement that moves the watermark and writes the hours behind it (store/sql/rollups.sql): any
number of workers may try at once, and each hour is written exactly once; a crash rolls back
the whole pass, so nothing is counted twice or lost.

Durations fall in :data:`DURATION_BOUNDS`' buckets, from which :func:`percentile` estimates
p50 and p95 (as Prometheus' ``histogram_quantile`` does) and Prometheus' histograms are
served.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta

import psycopg
from django.db import OperationalError, connections

from django_jobs import conf
from django_jobs.cursor import Cursor
from django_jobs.states import FAILED_OUTCOMES
from django_jobs.store import db
from django_jobs.store import rollups as statements
from django_jobs.store.operations_views import reading
from django_jobs.store.sql import query

#: The upper bounds, in seconds, of the duration buckets, from 100 ms to about 14 hours. Never
#: change them on a database that has rollups: the counts are stored by position.
DURATION_BOUNDS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
    3600.0, 7200.0, 14400.0, 28800.0, 50000.0,
)  # fmt: skip

#: How long after an hour's end it is rolled up: a finish is stamped with its transaction's
#: now(), so one that began before the hour ended commits a little later.
ROLLUP_DELAY = timedelta(minutes=5)

#: The hours one pass of ``rollupjobs`` or ``prunejobs`` covers (a worker's covers one: its
#: loop must not wait long).
COMMAND_SPAN = timedelta(hours=24)


#: The shortest pass: an hour, the rollups' grain.
MIN_SPAN = timedelta(hours=1)


def _timed_out(error: BaseException) -> bool:
    return isinstance(error.__cause__, psycopg.errors.QueryCanceled)


@dataclasses.dataclass
class RollupResult:
    """What :func:`roll_up` did."""

    #: Passes that moved the watermark, and the hourly rows they wrote.
    passes: int = 0
    rows: int = 0
    #: 1 when a pass found another process rolling up (it was left to that one).
    lost_races: int = 0
    rolled_until: datetime | None = None
    elapsed: float = 0.0

    def summary(self) -> str:
        until = (
            "nothing finished yet"
            if self.rolled_until is None
            else f"rolled up until {self.rolled_until:%Y-%m-%d %H:%M %Z}"
        )
        return f"{until}: {self.rows} hourly row(s) in {self.passes} pass(es) ({self.elapsed:.1f}s)"


def roll_up_once(cursor: Cursor, span: timedelta = COMMAND_SPAN) -> statements.Rolled | None:
    """One pass: roll up at most ``span`` of closed hours after the watermark. None when no hour
    is due (the watermark is at the last closed hour, or nothing has finished)."""
    where = statements.span(cursor, ROLLUP_DELAY, span)
    if where.pass_end is None:
        return None  # nothing has finished yet, or the last closed hour is rolled up
    start, end = where.rolled_until, where.pass_end
    return statements.roll_up(cursor, start, end, DURATION_BOUNDS)


def roll_up(
    *,
    alias: str | None = None,
    span: timedelta = COMMAND_SPAN,
    progress: Callable[[RollupResult], None] | None = None,
) -> RollupResult:
    """Roll up every closed hour after the watermark, ``span`` per transaction; call
    ``progress`` after each pass."""
    started = time.monotonic()
    result = RollupResult()
    with connections[alias or conf.database_alias()].cursor() as cursor:
        while True:
            try:
                rolled = roll_up_once(cursor, span)
            except OperationalError as exc:
                # A pass that runs into JOBS_STATEMENT_TIMEOUT_MS (a very busy day, a slow
                # server): the same hours in smaller passes, down to one hour.
                if not _timed_out(exc) or span <= MIN_SPAN:
                    raise
                span = max(MIN_SPAN, timedelta(hours=span // timedelta(hours=1) // 2))
                continue
            if rolled is None:
                break
            if not rolled.advanced:
                # Another process is rolling up (or just did): leave the rest to it.
                result.lost_races += 1
                break
            result.passes += 1
            result.rows += rolled.rows
            result.elapsed = time.monotonic() - started
            if progress is not None:
                progress(result)
        result.rolled_until = statements.rolled_until(cursor)
    result.elapsed = time.monotonic() - started
    return result


def hourly_attempts(
    since: datetime, now: datetime, using: str | None = None
) -> dict[datetime, tuple[int, int]]:
    """Attempts (done, failed) ended per UTC hour from ``since`` to ``now``, by hour: the
    rolled-up hours from the rollups, the hours after the watermark (at most the last 24) from
    the attempts through ``django_jobs_throughput``. From ``JOBS_READ_DATABASE`` unless
    ``using``."""
    with reading(using) as cursor:
        hours = {
            row.hour: (row.done, row.failed) for row in statements.hourly_attempts(cursor, since)
        }
        watermark = statements.rolled_until(cursor)
        recent = max(since, watermark or since, now - timedelta(hours=24))
        rows = db.execute(cursor, query("throughput_hours"), {"since": recent})
        for row in db.fetch_all_as(rows, statements.HourCounts):
            done, failed = hours.get(row.hour, (0, 0))
            hours[row.hour] = (done + row.done, failed + row.failed)
    return hours


@dataclasses.dataclass
class TaskStatistics:
    """A task's history over the last days, from the hourly rollups (:func:`task_statistics`)."""

    task: str
    #: Jobs that ended (done, error, cancelled), and those that ended in error or cancelled.
    jobs: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    #: Attempts that ended, and those that failed (error, timeout, lost, crashed).
    attempts: int = 0
    failed_attempts: int = 0
    #: Run time of the successful attempts: p50 and p95 (from the buckets), mean.
    p50_seconds: float | None = None
    p95_seconds: float | None = None
    mean_seconds: float | None = None
    #: Per UTC day, oldest first (today last): (day, jobs ended, jobs failed).
    daily: list[tuple[date, int, int]] = dataclasses.field(default_factory=list)

    @property
    def failure_rate(self) -> float | None:
        """Jobs that ended in error among those that ended done or in error."""
        ended = self.done + self.failed
        return None if ended == 0 else self.failed / ended


def task_statistics(
    days: int = 7, tasks: int = 50, using: str | None = None
) -> list[TaskStatistics]:
    """The count, failure rate, p50/p95 duration and daily trend over the last ``days`` UTC
    days (today included) of the ``tasks`` tasks that ended the most jobs in them, busiest
    first, read from the hourly rollups: what has finished since the last closed hour is not in
    them yet. From ``JOBS_READ_DATABASE`` unless ``using``."""
    with reading(using) as cursor:
        rows = statements.task_days(cursor, days, tasks)
    if not rows:
        return []
    day_list = [rows[0].today - timedelta(days=days - 1 - i) for i in range(days)]
    found: dict[str, TaskStatistics] = {}
    per_day: dict[str, dict[date, list[int]]] = {}
    done_buckets: dict[str, list[int]] = {}
    done_seconds: dict[str, tuple[float, int]] = {}
    for row in rows:
        stats = found.setdefault(row.task, TaskStatistics(row.task))
        day = per_day.setdefault(row.task, {d: [0, 0] for d in day_list})
        counts = day.setdefault(row.day, [0, 0])
        stats.jobs += row.jobs
        stats.attempts += row.attempts
        counts[0] += row.jobs
        if row.outcome == "done":
            stats.done += row.jobs
            done_buckets[row.task] = list(row.buckets)  # the period's, on each of its days
            seconds, n = done_seconds.get(row.task, (0.0, 0))
            done_seconds[row.task] = (seconds + row.seconds, n + row.attempts)
        elif row.outcome == "error":
            stats.failed += row.jobs
            counts[1] += row.jobs
        elif row.outcome == "cancelled":
            stats.cancelled += row.jobs
        if row.outcome in FAILED_OUTCOMES:
            stats.failed_attempts += row.attempts
    for task, stats in found.items():
        buckets = done_buckets.get(task, [])
        stats.p50_seconds = percentile(buckets, 0.5)
        stats.p95_seconds = percentile(buckets, 0.95)
        seconds, n = done_seconds.get(task, (0.0, 0))
        stats.mean_seconds = seconds / n if n else None
        stats.daily = [(d, c[0], c[1]) for d, c in sorted(per_day[task].items())]
    return sorted(found.values(), key=lambda s: (-s.jobs, s.task))


def percentile(
    buckets: Sequence[int], q: float, bounds: Sequence[float] = DURATION_BOUNDS
) -> float | None:
    """The ``q`` quantile (0..1) of the durations counted in ``buckets``, interpolated linearly
    inside its bucket (from 0 for the first); a duration in the last, open bucket is reported
    as the last bound. None when nothing is counted."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            low = 0.0 if i == 0 else bounds[i - 1]
            return low + (bounds[i] - low) * max(rank - seen, 0) / n
        seen += n
    return bounds[-1]


def add_buckets(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Two bucket arrays summed position by position."""
    width = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width)]
