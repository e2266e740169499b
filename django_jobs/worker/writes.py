"""The writes a worker owes its queue for the jobs it has run: finishes, settling, releases and
hand-backs, each queued in the outbox and made from there (see outbox.py).

A finish is fenced on the job's lease, and so is safe to write twice: a finish tried again after
a lost reply finds its outcome already recorded, and one that the database lost in a crash is
written again from memory when the next heartbeat finds its job an orphan. A busy worker claims
its next job in the same round trip as a finish; the supervisor starts it once it has committed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from django_jobs import conf, store, workflows
from django_jobs.reaper import Remembered, recover_orphans
from django_jobs.registry import registry
from django_jobs.states import Outcome
from django_jobs.storable import storable_text
from django_jobs.store import ClaimedJob, Ended, Lease
from django_jobs.worker import deploys
from django_jobs.worker.duties import DatabaseDuties
from django_jobs.worker.executor import Report
from django_jobs.worker.outbox import Outbox, Write
from django_jobs.worker.outcomes import OutcomeLog
from django_jobs.worker.postgres_queue import Queue
from django_jobs.worker.slots import Slot

#: Seconds of settling (workflows.Settling) between two looks at the rest of the loop.
SETTLE_SLICE = 0.05


class NextJob(Protocol):
    """Where a finish hands the job it claimed in the same round trip: the supervisor."""

    queues: list[str]
    # Set when a write may have made jobs ready: the supervisor claims without waiting.
    queue_may_have_work: bool

    def slot_for_next_job(self) -> Slot | None:
        """The slot a claim made now would fill; ``None`` if no claim should be made now."""
        ...

    def claimed(self, slot: Slot, job: ClaimedJob | None) -> bool:
        """Start ``job`` (claimed for ``slot``); ``None``: the queue had no job. False if the
        job was handed back instead."""
        ...


class Finished(NamedTuple):
    """What a finish write found: where the attempt left the job (``None``: nothing matched its
    lease), whether an earlier try had already recorded it, and the job claimed with it."""

    ended: Ended | None
    already_recorded: bool
    slot: Slot | None
    claimed: ClaimedJob | None


class JobWrites:
    def __init__(
        self,
        db: Queue,
        outbox: Outbox,
        log: OutcomeLog,
        unknown_tasks: deploys.UnknownTasks,
        next_job: NextJob,
        *,
        duties: DatabaseDuties | None,
        worker_timeout: float,
    ) -> None:
        self.db = db
        self.duties = duties
        self.outbox = outbox
        self.log = log
        self.unknown_tasks = unknown_tasks
        self.next_job = next_job
        self.worker_timeout = worker_timeout
        # Finishes that committed since the last heartbeat, by job id. If the database loses
        # one again (a failover to a standby that had not received it), the job shows up as an
        # orphan at the next heartbeat, and the finish is written again from here.
        self.remembered: dict[int, Remembered] = {}

    def recover_orphans(self, orphans: list[Lease], remembered: dict[int, Remembered]) -> None:
        """Write again the finishes the database lost; release the other orphans (see
        :func:`django_jobs.reaper.recover_orphans`)."""
        recover_orphans(orphans, remembered, self.release)

    def record(self, job: ClaimedJob, report: Report, elapsed: float) -> None:
        """Turn an executor's report into the job's finish write (queued in the outbox)."""
        retry_delay = 0.0
        if report.outcome != Outcome.DONE and report.retryable:
            if report.retry_after is not None:
                retry_delay = report.retry_after
            else:
                retry_delay = registry.backoff_for(job.task, job.attempt)
        options = {
            "result_json": report.result_json,
            "error": report.error,
            "traceback": report.traceback,
            "retryable": report.retryable,
            "retry_delay": retry_delay,
        }
        self.finish(job, report.outcome, options, elapsed)

    def finish(
        self,
        job: ClaimedJob,
        outcome: str,
        options: dict[str, Any],
        elapsed: float,
        *,
        replay: bool = False,
    ) -> None:
        """Queue the end of ``job``'s attempt as ``outcome``; ``replay``: a finish that had
        committed, written again because the database lost it."""
        self.outbox.add(self._finish_write(job, outcome, options, elapsed, replay=replay))
        self.outbox.flush()

    def _finish_write(
        self,
        job: ClaimedJob,
        outcome: str,
        options: dict[str, Any],
        elapsed: float,
        *,
        replay: bool = False,
        fallback: bool = True,
    ) -> Write:
        tries = 0

        def send() -> Callable[[], Finished]:
            # A busy worker claims its next job in the same round trip as this finish: for the
            # slot chosen here, on the loop's thread; the round trip itself may be made on
            # another (outbox.py), and touches nothing but the queue.
            slot = self.next_job.slot_for_next_job()
            queues = self.next_job.queues
            skip = self.unknown_tasks.skip() if slot is not None else []

            def write() -> Finished:
                nonlocal tries
                tries += 1
                claimed = None
                if slot is None:
                    ended = self.db.finish(job.lease, outcome, **options)
                else:
                    ended, claimed = self.db.finish_and_claim(
                        job.lease, outcome, queues, skip, **options
                    )
                # Matched nothing after an earlier try: maybe that one committed, and only its
                # reply was lost.
                already = (
                    ended is None
                    and (tries > 1 or replay)
                    and self.db.attempt_outcome(job.lease) == outcome
                )
                return Finished(ended, already, slot, claimed)

            return write

        def then(result: Finished) -> None:
            ended = result.ended
            if ended is not None:
                again = functools.partial(self.finish, job, outcome, options, elapsed, replay=True)
                self.remembered[job.id] = Remembered(job.lease.token, again)
                if ended.needs_settling:
                    self.settle(job.id)
                self.log.finished(job, outcome, options, ended.state, elapsed)
            elif result.already_recorded:
                self.log.already_recorded(job, outcome)
                self.settle(job.id)
            else:
                self.log.lease_lost(job, f"could not record outcome {outcome}", elapsed)
            if result.slot is not None:
                self.next_job.claimed(result.slot, result.claimed)

        def plain_error(exc: BaseException | None) -> Write:
            # The outcome itself cannot be stored (text PostgreSQL refuses, say): record a plain
            # error that says so, rather than leave the job running with nobody to finish it.
            reason = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
            error = storable_text(f"the worker could not record outcome {outcome}: {reason}"[:2000])
            plain = {"error": error, "retryable": False, "retry_delay": 0.0}
            return self._finish_write(job, Outcome.ERROR, plain, elapsed, fallback=False)

        description = f"finish job {job.id}"
        if fallback:
            return Write(
                description, lambda: send()(), then, job.id, fallback=plain_error, send=send
            )
        return Write(description, lambda: send()(), then, job.id, droppable=False, send=send)

    def settle(self, job_id: int) -> None:
        """Queue what follows from ``job_id``'s end: after the finish has committed, in
        statements of their own (workflows.py). A worker without a database has nothing to
        settle: the server did so inside the finish."""
        duties = self.duties
        if duties is None:
            self.next_job.queue_may_have_work = True
            return
        settling = workflows.Settling.of(job_id)

        def run() -> None:
            # One slice at a time: a cascade over a million jobs must not stop heartbeats,
            # timeouts or claims. Its progress is the rows' own states, so a crash midway loses
            # nothing (the reaper's repair pass finishes it).
            duties.settle(settling, until=time.monotonic() + SETTLE_SLICE)
            # Settling may have made jobs ready (promoted dependents): claim without waiting.
            self.next_job.queue_may_have_work = True

        self.outbox.add(Write(f"settle job {job_id}", run, settling=settling))

    def release(
        self, lease: Lease, fields: dict[str, Any], reason: str = "released at worker shutdown"
    ) -> None:
        """Put a running job back to pending without using up an attempt."""

        def released(done: bool) -> None:
            if done:
                self.log.released(lease, fields)
            else:
                self.log.not_released(lease, fields)

        def write() -> bool:
            return self.db.release(lease, reason)

        self.outbox.add(Write(f"release job {lease.job_id}", write, released, lease.job_id))
        self.outbox.flush()

    def hand_back(self, job: ClaimedJob) -> None:
        """Give back a job whose task this worker has not registered (see deploys.py); end it in
        error once it has waited JOBS_UNKNOWN_TASK_TIMEOUT for a worker that has."""
        give_up_after = conf.unknown_task_timeout()

        def write() -> store.HandBack | None:
            return self.db.hand_back(
                job.lease,
                job.task,
                give_up_after=give_up_after,
                worker_timeout=self.worker_timeout,
                seen_since=self.unknown_tasks.seen_since(job.task),
            )

        def then(handed: store.HandBack | None) -> None:
            verdict = self.unknown_tasks.note(job.task, handed)
            if verdict == store.EXPIRED:
                options = deploys.expired(job.task, give_up_after)
                self.finish(job, Outcome.ERROR, options, 0.0)
            elif verdict != store.HANDED_BACK:
                self.log.lease_lost(job, "could not hand it back")

        self.outbox.add(Write(f"hand back job {job.id}", write, then, job.id))
        self.outbox.flush()
