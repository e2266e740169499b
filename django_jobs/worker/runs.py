"""Runs: a claimed job started in an executor, and what follows its end.

A job is started in a free slot, unless this worker still runs it under an older lease (a
reaper took it while heartbeats failed, say): then the older run is stopped first, and the new
one starts in its place once its executor has exited, so that a job never runs twice at once.
An executor that reports a job's end has its finish queued; one that exited (stopped for a
timeout, a cancellation, a lost lease or the end of the grace period, or crashed) has the end
its reason calls for queued, and is replaced, or retired if the worker is stopping.
"""

from __future__ import annotations

import logging

from django_jobs.states import Outcome
from django_jobs.store import ClaimedJob
from django_jobs.worker.executor import Report
from django_jobs.worker.fence import FENCE_SLACK
from django_jobs.worker.live import LiveWrites
from django_jobs.worker.observer import Observer
from django_jobs.worker.outcomes import OutcomeLog
from django_jobs.worker.process_pool import ExecutorPool
from django_jobs.worker.slots import STOP_LEASE_LOST, STOP_SHUTDOWN, Exited, Reported, Slot
from django_jobs.worker.writes import JobWrites

logger = logging.getLogger("django_jobs.worker")


class Runs:
    """The jobs a worker's ``pool`` runs, from their start to the writes of their end."""

    def __init__(
        self,
        pool: ExecutorPool,
        writes: JobWrites,
        live: LiveWrites,
        log: OutcomeLog,
        observer: Observer,
    ) -> None:
        self.pool = pool
        self.writes = writes
        self.live = live
        self.log = log
        self.observer = observer

    def start(self, slot: Slot, job: ClaimedJob) -> None:
        """Start ``job`` in ``slot``; or, if an older run of it is still here, once that one
        has been stopped."""
        self.observer.claimed(job)
        self.log.claimed(job)
        holder = self.pool.holder(job.id)
        if holder is not None and holder is not slot:
            # This worker still runs the job under an older lease, which this claim proves lost
            # (a reaper took the job while heartbeats failed, say). Stop that run, and start
            # this one only once its executor has exited.
            assert holder.job is not None
            logger.warning(
                "job %d claimed again (attempt %d) while attempt %d still runs here: stopping"
                " the older run before starting the new one",
                job.id,
                job.attempt,
                holder.job.attempt,
                extra=self.log.fields(job),
            )
            if holder.deferred is not None:
                self.log.lease_lost(
                    holder.deferred, "superseded by a newer claim before it started"
                )
            self.pool.defer(holder, job)
            return
        self.pool.assign(slot, job)

    def reported(self, event: Reported) -> None:
        """Queue the finish of a job its executor reported the end of."""
        self.live.last(event.watch)
        self.writes.record(event.job, event.report, event.elapsed)

    def exited(self, exited: Exited, *, stopping: bool) -> None:
        """Queue the end of the run of an executor that exited, and replace the executor (or
        retire it, if the worker is ``stopping``)."""
        job, slot, elapsed = exited.job, exited.slot, exited.elapsed
        if job is not None and exited.reason != STOP_LEASE_LOST:
            self.live.last(exited.watch)  # what it wrote up to its end, before that end
        if job is None:
            if exited.reason is None and not stopping:
                logger.warning("executor %d exited (%s); replacing it", slot.index, exited.how())
        elif self.pool.fenced(slot):
            self._fenced(job, exited)
        elif exited.reason == STOP_SHUTDOWN:
            self.writes.release(job.lease, self.log.fields(job))
        elif exited.reason == STOP_LEASE_LOST:
            self.log.lease_lost(job, "stopped: its lease was lost", elapsed)
        else:  # timed out, cancelled or crashed: the attempt ends so
            self.writes.record(job, exited.report(job), elapsed)
        deferred, slot.deferred = slot.deferred, None
        if not stopping:
            replacement = self.pool.replace(slot)
            if deferred is not None:
                self.start(replacement, deferred)
        else:
            self.pool.retire(slot)
            if deferred is not None:
                self.writes.release(deferred.lease, self.log.fields(deferred))

    def _fenced(self, job: ClaimedJob, exited: Exited) -> None:
        """Record the end of a job that its executor stopped because this worker's heartbeats
        had stopped committing (the supervisor was stalled, or the database out of reach): the
        attempt is lost, as the reaper would have recorded it. If the reaper has already done
        so, the fenced write is refused and the log says that another run owns the job."""
        fence = self.pool.fence
        after = fence.after
        logger.warning(
            "job %d was stopped by its own executor (%s): no heartbeat of this worker had"
            " committed for %.1fs (JOBS_WORKER_TIMEOUT %gs less JOBS_KILL_GRACE %gs and %gs of"
            " slack; was this worker stalled, or the database out of reach?), so the reaper may"
            " give the job to another worker; recording the attempt lost",
            job.id,
            exited.how(),
            after,
            fence.worker_timeout,
            fence.kill_grace,
            FENCE_SLACK,
            extra=self.log.fields(job),
        )
        error = (
            f"stopped by its executor: no heartbeat of worker {job.lease.worker_id} had"
            f" committed for {after:.1f}s"
        )
        report = Report(job.id, Outcome.LOST, error=error, retryable=True)
        self.writes.record(job, report, exited.elapsed)
