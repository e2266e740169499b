"""What only a worker that holds a database connection does, beside running jobs.

A worker of the HTTP API leaves all of this to the server: it settles workflows inside each
finish, its reaper recovers a silent worker's jobs, and it owns ``JOBS_QUEUE_LIMITS``, the
schedules, the alert thresholds and the rollups. So these duties are not part of the
:class:`~django_jobs.worker.postgres_queue.Queue` protocol that every transport implements: the
supervisor is given them only when it has a database (:class:`PostgresDuties`, on the same
connection as its queue), and skips them otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from django_jobs import alerts, queues, rollups, workflows
from django_jobs.reaper import recover_earlier_boots
from django_jobs.schedules import declarations, ticks
from django_jobs.store import WorkerInfo, job_reads
from django_jobs.store.connection import QueueConnection
from django_jobs.store.rollups import Rolled
from django_jobs.worker.postgres_queue import FAILED, QueueGate


class DatabaseDuties(Protocol):
    """The statements a worker with a database runs besides its queue's. Each raises on a
    database error, which the worker's :class:`~django_jobs.worker.postgres_queue.QueueGate`
    meets as it meets the queue's."""

    def settle(self, settling: workflows.Settling, until: float) -> None:
        """Settle what follows from a job's end (parents, dependents), until ``until``."""
        ...

    def recover_earlier_boots(self, worker: WorkerInfo) -> None:
        """Recover the jobs an earlier boot of ``worker``'s name left running."""
        ...

    def sync_queue_limits(self) -> None:
        """Write ``JOBS_QUEUE_LIMITS`` into the queue table."""
        ...

    def sync_alert_thresholds(self) -> None:
        """Write ``JOBS_ALERTS`` and the tasks' expected durations into the table the
        ``django_jobs_alerts`` view reads."""
        ...

    def sync_schedules(self) -> declarations.SyncReport:
        """Sync the schedules declared in code, and the alert thresholds (their grace)."""
        ...

    def fire_schedules(self, tasks: list[str]) -> ticks.FirePass:
        """Enqueue the due ticks of the schedules of ``tasks``."""
        ...

    def expire_due(self) -> list[int]:
        """End a batch of pending jobs past their deadline, cancelled as expired, with their
        dependents (:func:`django_jobs.workflows.expire_due`); the ids ended."""
        ...

    def roll_up(self, span: timedelta) -> Rolled | None:
        """Roll up at most ``span`` of closed hours (:func:`django_jobs.rollups.roll_up_once`)."""
        ...

    def next_ready_within(
        self, queues: Sequence[str], skip_tasks: Sequence[str], within: float
    ) -> float | None:
        """Seconds until the next job of ``queues`` (all when empty) becomes ready, if one does
        within ``within`` seconds; else None. For ``--burst-wait``."""
        ...


class PostgresDuties:
    """:class:`DatabaseDuties` over the worker's one connection (autocommit: every statement is
    its own short transaction)."""

    def __init__(self, connection: QueueConnection) -> None:
        self.connection = connection

    def settle(self, settling: workflows.Settling, until: float) -> None:
        with self.connection.cursor() as cursor:
            settling.run(cursor, until=until)

    def recover_earlier_boots(self, worker: WorkerInfo) -> None:
        with self.connection.cursor() as cursor:
            recover_earlier_boots(cursor, worker)

    def sync_queue_limits(self) -> None:
        with self.connection.cursor() as cursor:
            queues.sync_limits(cursor)

    def sync_alert_thresholds(self) -> None:
        with self.connection.cursor() as cursor:
            alerts.sync_thresholds(cursor)

    def sync_schedules(self) -> declarations.SyncReport:
        with self.connection.cursor() as cursor:
            report = declarations.sync(cursor)
            alerts.sync_thresholds(cursor)
            return report

    def fire_schedules(self, tasks: list[str]) -> ticks.FirePass:
        with self.connection.cursor() as cursor:
            return ticks.fire_due(cursor, tasks)

    def expire_due(self) -> list[int]:
        with self.connection.cursor() as cursor:
            return workflows.expire_due(cursor)

    def roll_up(self, span: timedelta) -> Rolled | None:
        with self.connection.cursor() as cursor:
            return rollups.roll_up_once(cursor, span)

    def next_ready_within(
        self, queues: Sequence[str], skip_tasks: Sequence[str], within: float
    ) -> float | None:
        with self.connection.cursor() as cursor:
            return job_reads.next_ready_within(cursor, queues or None, skip_tasks, within)


def start_up(duties: DatabaseDuties, gate: QueueGate, worker: WorkerInfo) -> bool:
    """What a worker with a database does once, before its first claim: recover the jobs that
    its earlier boots left running, write ``JOBS_QUEUE_LIMITS`` into the queue table and the
    alert thresholds into theirs. False if the database refused (the worker tries again)."""

    def run() -> None:
        # A container restarted in its pod keeps its name: its earlier boot's jobs are lost.
        duties.recover_earlier_boots(worker)
        duties.sync_queue_limits()
        duties.sync_alert_thresholds()

    return gate.call("startup recovery", run) is not FAILED
