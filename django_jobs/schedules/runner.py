"""The scheduler step: periodic jobs fired from a worker's loop (or ``runjobscheduler``'s).

A step runs only when due: at most :func:`~django_jobs.conf.scheduler_interval` seconds apart
(so that an edit in the admin takes effect within that), and sooner when the next schedule is
due sooner. It uses the connection the worker already has (no connection of its own), holds no
transaction between steps, and meets database errors at the :class:`QueueGate`, with its
backoff. The first step syncs the schedules code declares
(:func:`django_jobs.schedules.declarations.sync`), and so does the first step after a sync or a
step failed, or after the database was away (a server that crashed or failed over comes back
with what it had made durable: a sync is cheap, and safe to repeat); the others fire due ticks
(:func:`django_jobs.schedules.ticks.fire_due`): any number of schedulers may run, each tick
enqueues once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django_jobs import conf
from django_jobs.registry import registry
from django_jobs.runtime.backoff import Backoff
from django_jobs.schedules.declarations import SyncReport
from django_jobs.schedules.ticks import FirePass
from django_jobs.worker.duties import DatabaseDuties
from django_jobs.worker.postgres_queue import FAILED, QueueGate

logger = logging.getLogger("django_jobs.schedules")

#: Seconds before looking again when a due schedule is being handled by another scheduler.
LOCKED_RETRY = 1.0
#: The longest wait before trying again after a failure that is not an outage.
FAILURE_RETRY_CAP = 60.0
#: Seconds after the database's now() at which a step wakes for a due time (clock skew).
SLACK = 0.01


class Scheduler:
    """Fire the due ticks of the schedules of ``tasks`` (default: every task registered
    here; a schedule of a task this process lacks is left to a process that has it). Without
    ``duties`` (a worker of the HTTP API) it never fires."""

    def __init__(
        self,
        duties: DatabaseDuties | None,
        gate: QueueGate,
        *,
        enabled: bool = True,
        interval: float | None = None,
        tasks: Sequence[str] | None = None,
    ) -> None:
        self.duties = duties
        self.gate = gate
        self.enabled = enabled and duties is not None
        self.interval = conf.scheduler_interval() if interval is None else interval
        self.tasks = list(registry.names() if tasks is None else tasks)
        #: When the next step is due (time.monotonic()); never when disabled.
        self.due_at = 0.0 if self.enabled else float("inf")
        self.synced = False
        self.backoff = Backoff(FAILURE_RETRY_CAP)
        self.fired = 0

    def step(self, stopping: bool = False) -> FirePass | None:
        """Sync or fire, if a step is due; return what a firing pass did."""
        now = time.monotonic()
        if stopping:
            self.due_at = float("inf")  # no more ticks from a worker that is stopping
        if self.gate.waiting():  # the database is away: look again when the queue does
            self.due_at = max(self.due_at, self.gate.retry_at)
            self.synced = False  # and sync again first: it may come back without the last sync
        duties = self.duties
        if duties is None or now < self.due_at:
            return None
        if not self.synced:
            report = self.gate.call("schedule sync", duties.sync_schedules, own_backoff=True)
            if report is FAILED:
                self._failed(now)
                return None
            self.synced = True
            self._synced(report)
        done = self.gate.call(
            "schedules", lambda: duties.fire_schedules(self.tasks), own_backoff=True
        )
        if done is FAILED:
            self._failed(now)
            return None
        self.backoff.succeeded()
        for line in done.outcomes:
            logger.info("schedule %s", line)
        self.fired += done.fired
        wait = self.interval
        if done.seconds_until_due is not None:
            wait = min(wait, max(done.seconds_until_due, 0.0) + SLACK)
            if done.seconds_until_due <= 0 and not done.handled:
                wait = LOCKED_RETRY  # another scheduler is handling it right now
        self.due_at = time.monotonic() + wait
        return done

    def _failed(self, now: float) -> None:
        """After a database error: an outage waits for the queue's own backoff (claims and
        heartbeats wait for it too); any other error backs off the scheduler alone, so that a
        schedule that keeps failing never holds back the worker's jobs. Either way, the next
        step syncs again first."""
        self.synced = False
        if self.gate.queue.broken:
            self.due_at = max(now + LOCKED_RETRY, self.gate.retry_at)
        else:
            self.due_at = now + self.backoff.failed()

    def _synced(self, report: SyncReport) -> None:
        for name, why in report.errors.items():
            logger.error("schedule %s not synced: %s", name, why)
        for name in report.conflicts:
            logger.warning(
                "schedule %s not synced: a schedule made in the admin has its name", name
            )
        if not report.in_sync:
            logger.info("schedules synced: %s", report.summary())
