"""The metrics, read from PostgreSQL in one short reading transaction (store/sql/metrics.sql)
and shaped as ``prometheus_client`` metric families.

Gauges describe now: unfinished jobs per queue and state, the oldest ready job's age, live
workers per queue, schedules, firing alerts. Counters and the duration histogram count since
the beginning: the rollups' all-time totals plus what ended after their watermark, read in one
statement, so they never go back, and pruning (which deletes only jobs the rollups counted)
changes none of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.utils import floatToGoString

from django_jobs.rollups import DURATION_BOUNDS, add_buckets
from django_jobs.store import metrics as reads
from django_jobs.store.operations_views import reading

PREFIX = "django_jobs"
SEVERITIES = ("warning", "critical")


class _Counted:
    """One (queue, task, outcome)'s sums: totals plus the tail after the watermark."""

    def __init__(self) -> None:
        self.jobs = 0
        self.attempts = 0
        self.seconds = 0.0
        self.buckets: list[int] = [0] * (len(DURATION_BOUNDS) + 1)
        self.waited_jobs = 0
        self.wait_seconds = 0.0

    def add(self, row: reads.FinishedRow) -> None:
        self.jobs += row.jobs
        self.attempts += row.attempts
        self.seconds += row.seconds or 0.0
        self.waited_jobs += row.waited_jobs
        self.wait_seconds += row.wait_seconds or 0.0
        if row.buckets:
            self.buckets = add_buckets(self.buckets, row.buckets)
        if row.bucket is not None:
            self.buckets[min(row.bucket, len(self.buckets) - 1)] += row.attempts


def read(using: str | None = None) -> list[Metric]:
    """Every metric family, read now."""
    started = time.perf_counter()
    with reading(using) as cursor:
        queues = reads.queues(cursor)
        workers = reads.workers(cursor)
        rollups = reads.rollups(cursor)
        finished = reads.finished(cursor, DURATION_BOUNDS, rollups.rolled_until)
        schedules = reads.schedules(cursor)
        alerts = reads.alerts(cursor)
    families: list[Metric] = []
    families += _queue_families(queues)
    families += _worker_families(workers)
    families += _finished_families(finished)
    families += _schedule_families(schedules)
    families += _alert_families(alerts)
    lag = GaugeMetricFamily(
        f"{PREFIX}_rollups_lag_seconds",
        "Seconds from the rollups' watermark to now: finishes after it are read from the job "
        "table on each scrape (an hour and 5 minutes is normal; NaN: no rollup yet).",
    )
    lag.add_metric([], float("nan") if rollups.lag_seconds is None else rollups.lag_seconds)
    families.append(lag)
    took = GaugeMetricFamily(
        f"{PREFIX}_metrics_read_seconds",
        "Seconds this page took to read its numbers from PostgreSQL.",
    )
    took.add_metric([], time.perf_counter() - started)
    families.append(took)
    return families


def _queue_families(queues: list[reads.QueueRow]) -> list[Metric]:
    jobs = GaugeMetricFamily(
        f"{PREFIX}_jobs",
        "Unfinished jobs per queue and state (pending, running, waiting for dependencies).",
        labels=["queue", "state"],
    )
    ready = GaugeMetricFamily(
        f"{PREFIX}_ready_jobs", "Pending jobs whose run_after has passed.", labels=["queue"]
    )
    scheduled = GaugeMetricFamily(
        f"{PREFIX}_scheduled_jobs",
        "Pending jobs whose run_after is still ahead.",
        labels=["queue"],
    )
    age = GaugeMetricFamily(
        f"{PREFIX}_oldest_ready_job_age_seconds",
        "Seconds the oldest ready job of the queue has waited since its run_after (0: none).",
        labels=["queue"],
    )
    live = GaugeMetricFamily(
        f"{PREFIX}_live_workers",
        "Live workers that serve the queue (those serving every queue included).",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        f"{PREFIX}_queue_paused", "1 while the queue is paused.", labels=["queue"]
    )
    limit = GaugeMetricFamily(
        f"{PREFIX}_queue_concurrency_limit",
        "The queue's cluster-wide concurrency limit (no series: no limit).",
        labels=["queue"],
    )
    for q in queues:
        for state in ("pending", "running", "waiting"):
            jobs.add_metric([q.queue, state], getattr(q, state))
        ready.add_metric([q.queue], q.ready)
        scheduled.add_metric([q.queue], q.scheduled)
        age.add_metric([q.queue], q.oldest_ready_age_seconds)
        live.add_metric([q.queue], q.live_workers)
        paused.add_metric([q.queue], 1 if q.paused else 0)
        if q.concurrency_limit is not None:
            limit.add_metric([q.queue], q.concurrency_limit)
    return [jobs, ready, scheduled, age, live, paused, limit]


def _worker_families(rows: list[reads.WorkersRow]) -> list[Metric]:
    workers = GaugeMetricFamily(
        f"{PREFIX}_workers",
        "Registered workers: live, or silent (no heartbeat within JOBS_WORKER_TIMEOUT; the "
        "reaper recovers their jobs).",
        labels=["status"],
    )
    slots = GaugeMetricFamily(
        f"{PREFIX}_worker_slots", "Executor slots of the live workers.", labels=["status"]
    )
    busy = GaugeMetricFamily(
        f"{PREFIX}_worker_running_jobs",
        "Jobs running under the workers, by the workers' status.",
        labels=["status"],
    )
    found = {row.alive: row for row in rows}
    for alive, status in ((True, "live"), (False, "silent")):
        row = found.get(alive)
        workers.add_metric([status], row.workers if row else 0)
        slots.add_metric([status], row.slots if row else 0)
        busy.add_metric([status], row.running_jobs if row else 0)
    return [workers, slots, busy]


def _finished_families(rows: list[reads.FinishedRow]) -> list[Metric]:
    counted: dict[tuple[str, str, str], _Counted] = {}
    for row in rows:
        counted.setdefault((row.queue, row.task, row.outcome), _Counted()).add(row)
    jobs = CounterMetricFamily(
        f"{PREFIX}_jobs_finished",
        "Jobs that ended, per queue, task and final state (done, error, cancelled).",
        labels=["queue", "task", "outcome"],
    )
    attempts = CounterMetricFamily(
        f"{PREFIX}_attempts",
        "Attempts that ended, per queue, task and outcome (done, error, timeout, lost, "
        "crashed, cancelled, released).",
        labels=["queue", "task", "outcome"],
    )
    seconds = CounterMetricFamily(
        f"{PREFIX}_attempt_seconds",
        "Run time of the attempts that ended, summed, per queue, task and outcome.",
        labels=["queue", "task", "outcome"],
    )
    durations = HistogramMetricFamily(
        f"{PREFIX}_attempt_duration_seconds",
        "Run time of the successful attempts, per queue and task (histogram_quantile(0.95, "
        "...) for a p95).",
        labels=["queue", "task"],
    )
    waits = SummaryMetricFamily(
        f"{PREFIX}_job_wait_seconds",
        "Seconds the ended jobs' final attempts waited from ready (run_after) to their start.",
        labels=["queue", "task", "outcome"],
    )
    for (queue, task, outcome), c in sorted(counted.items()):
        labels = [queue, task, outcome]
        if c.jobs or outcome in ("done", "error", "cancelled"):
            jobs.add_metric(labels, c.jobs)
        if c.attempts:
            attempts.add_metric(labels, c.attempts)
            seconds.add_metric(labels, c.seconds)
            if outcome == "done":
                durations.add_metric([queue, task], list(_cumulative(c.buckets)), c.seconds)
        if c.waited_jobs:
            waits.add_metric(labels, c.waited_jobs, c.wait_seconds)
    return [jobs, attempts, seconds, durations, waits]


def _cumulative(buckets: list[int]) -> Iterator[tuple[str, float]]:
    running = 0
    for bound, n in zip(DURATION_BOUNDS, buckets, strict=False):
        running += n
        yield floatToGoString(bound), running
    yield "+Inf", sum(buckets)


def _schedule_families(rows: list[reads.ScheduleRow]) -> list[Metric]:
    success = GaugeMetricFamily(
        f"{PREFIX}_schedule_last_success_timestamp_seconds",
        "When the schedule's last successful run finished (Unix time; no series: none on record).",
        labels=["schedule", "task"],
    )
    late = GaugeMetricFamily(
        f"{PREFIX}_schedule_late_seconds",
        "Seconds the schedule's next tick is overdue (0: not due). Well over the scheduler "
        "interval: no scheduler fires it.",
        labels=["schedule", "task"],
    )
    upcoming = GaugeMetricFamily(
        f"{PREFIX}_schedule_next_run_timestamp_seconds",
        "The schedule's next tick (Unix time).",
        labels=["schedule", "task"],
    )
    for s in rows:
        labels = [s.name, s.task]
        if s.last_success_epoch is not None:
            success.add_metric(labels, s.last_success_epoch)
        late.add_metric(labels, s.late_seconds or 0.0)
        if s.next_run_epoch is not None:
            upcoming.add_metric(labels, s.next_run_epoch)
    return [success, late, upcoming]


def _alert_families(rows: list[reads.AlertRow]) -> list[Metric]:
    firing = GaugeMetricFamily(
        f"{PREFIX}_alerts_firing",
        "1 per row of the django_jobs_alerts view: a condition firing now "
        "(deploy/prometheus/django-jobs-alerts.yaml alerts on these).",
        labels=["kind", "subject", "severity"],
    )
    count = GaugeMetricFamily(
        f"{PREFIX}_firing_alerts", "Firing alerts, per severity.", labels=["severity"]
    )
    per_severity = dict.fromkeys(SEVERITIES, 0)
    for a in rows:
        firing.add_metric([a.kind, a.subject, a.severity], 1)
        per_severity[a.severity] = per_severity.get(a.severity, 0) + 1
    for severity, n in per_severity.items():
        count.add_metric([severity], n)
    return [firing, count]


class _Families:
    """A collector of families read once (one page's worth)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families

    def describe(self) -> list[Any]:
        return []


def registry(using: str | None = None) -> CollectorRegistry:
    """A registry holding the metrics read now: render it with ``prometheus_client``."""
    found = CollectorRegistry(auto_describe=False)
    found.register(_Families(read(using)))
    return found
