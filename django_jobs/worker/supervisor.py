"""The supervisor: the one process of a worker that talks to the queue.

It owns a single PostgreSQL connection (autocommit, so every statement is its own short
transaction) for claims, finishes, releases and heartbeats, and hands claimed jobs to a pool of
executor processes over pipes. No transaction is open and no lock is held while a job runs.

One loop, no threads: wait on the executors' pipes and process sentinels, a signal wake-up
socket and a timer; then react. Writes that fail because the database is away are kept in an
outbox and retried with backoff, so a finished job's result survives a database restart.

Every claim and finish commits durably, and every write of a run is fenced on its lease token.
What a server crash or a lost reply can still leave behind, the heartbeat finds (see
``_recover_orphans``): a claim whose reply never arrived is released without counting the
attempt, and a finish that the database lost again is written again from memory.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import multiprocessing
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from django.conf import settings

from django_jobs import conf, db, transitions, workflows
from django_jobs.reaper import end_attempts
from django_jobs.registry import registry
from django_jobs.states import Outcome
from django_jobs.storable import storable_text
from django_jobs.transitions import ClaimedJob, Lease, WorkerInfo
from django_jobs.worker.connection import (
    OUTAGE_RETRY_CAP,
    Complaints,
    QueueConnection,
    backoff,
    is_connection_fatal,
)
from django_jobs.worker.executor import Assignment, Report, executor_main
from django_jobs.worker.identity import base_name, name_of, new_worker_id
from django_jobs.worker.wakeup import Wakeup

logger = logging.getLogger("django_jobs.worker")

# Why an executor was stopped by the supervisor, and the attempt outcome that follows.
STOP_TIMEOUT = "timeout"
STOP_CANCELLED = "cancelled"
STOP_SHUTDOWN = "shutdown"
STOP_LEASE_LOST = "lease_lost"


@dataclasses.dataclass
class Slot:
    """One executor process and the job it is running, if any."""

    index: int
    process: BaseProcess
    conn: Connection
    ready: bool = False
    job: ClaimedJob | None = None
    started: float = 0.0
    deadline: float | None = None
    stop_reason: str | None = None
    kill_at: float | None = None
    # A newer claim of the job that this slot's executor still runs under an older lease: it
    # starts here once that executor has exited, so that the job never runs twice at once.
    deferred: ClaimedJob | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None or self.deferred is not None


@dataclasses.dataclass(eq=False)
class Write:
    """A write to the queue, kept in the outbox until it has committed."""

    description: str
    # Runs the write on a cursor; may return what to do once it has committed.
    run: Callable[[Any], Any]
    # The job it ends, if any: that job is no orphan while the write waits.
    job_id: int | None = None
    # A simpler write to make instead if this one keeps failing (not an outage).
    fallback: Callable[[BaseException | None], Write] | None = None
    # Whether to drop the write if it keeps failing, and has no fallback. A job's last-resort
    # finish is never dropped: its job would be left running with nobody to finish it.
    droppable: bool = True
    # Failures of this write that were not an outage (a lock wait that ran out, say), and when
    # to try it again: each write backs off on its own, so one never holds back the others.
    failures: int = 0
    retry_at: float = 0.0
    # For the settling that follows a job's end: it runs a slice at a time.
    settling: workflows.Settling | None = None


@dataclasses.dataclass(frozen=True)
class Remembered:
    """A finish that has committed, kept until a later heartbeat proves it is still there."""

    token: str | None
    replay: Callable[[], None]


@dataclasses.dataclass
class WorkerStats:
    claimed: int = 0
    done: int = 0
    failed: int = 0
    lost_leases: int = 0


class Supervisor:
    """Run jobs from ``queues`` (all queues when empty) with ``concurrency`` executors."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        name: str | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        grace: float = 25.0,
        install_signals: bool = True,
        listen: bool | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.queues = list(queues or [])
        self.concurrency = concurrency
        self.name = base_name(name)
        self.worker_id = new_worker_id(self.name)
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = conf.poll_interval() if poll_interval is None else poll_interval
        self.grace = grace
        self.install_signals = install_signals
        self.heartbeat_interval = conf.heartbeat_interval()
        self.worker_timeout = conf.worker_timeout()
        self.kill_grace = conf.kill_grace()

        self.db = QueueConnection(conf.database_alias(), self.worker_id)
        self.wakeup = (
            Wakeup(conf.database_alias(), self.worker_id, self.queues)
            if (conf.listen() if listen is None else listen)
            else None
        )
        self.info = WorkerInfo(
            id=self.worker_id,
            name=self.name,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues,
            concurrency=concurrency,
            pod=os.environ.get("POD_NAME", ""),
            tasks=registry.names(),
        )
        self.stats = WorkerStats()
        self.slots: list[Slot] = []
        # Writes to make, in order.
        self.outbox: collections.deque[Write] = collections.deque()
        # Jobs this worker has ended whose write is still in the outbox: not orphans.
        self.unwritten: set[int] = set()
        # Finishes that committed since the last heartbeat, by job id. If the database loses
        # one again (a failover to a standby that had not received it), the job shows up as an
        # orphan at the next heartbeat, and the finish is written again from here.
        self.remembered: dict[int, Remembered] = {}
        self.last_db_error: BaseException | None = None
        self.stopping = False
        self.hard_stop = False
        self.grace_deadline: float | None = None
        self.queue_may_have_work = True
        self.next_poll = 0.0
        self.next_heartbeat = 0.0
        # No claim before the first heartbeat has registered this worker.
        self.last_heartbeat_ok = float("-inf")
        self.recovered = False
        self.db_retry_at = 0.0
        self.db_failures = 0
        self.last_error_transient = False
        # A database that is away or failing is reported at once, then once a minute.
        self.db_complaints = Complaints()
        # Tasks not registered here whose jobs claims pass over, until when (monotonic); and
        # since when (the database's clock) workers have been found without each.
        self.missing_tasks: dict[str, float] = {}
        self.missing_since: dict[str, datetime.datetime] = {}
        # Jobs handed back because their task is not registered here, by task, not yet logged.
        self.handed_back: collections.Counter[str] = collections.Counter()
        self.handed_back_logged_at: dict[str, float] = {}
        # Set while the outbox is being flushed: a write queued meanwhile waits for the next
        # flush instead of starting one of its own, so that nothing recurses job after job.
        self.flushing = False
        self._mp = multiprocessing.get_context("spawn")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Serve jobs until stopped; return the process exit code."""
        previous_handlers = self._install_signal_handlers() if self.install_signals else None
        logger.info(
            "worker %s starting: queues=%s concurrency=%d%s",
            self.worker_id,
            ",".join(self.queues) or "*",
            self.concurrency,
            " burst" if self.burst else "",
            extra={"worker_id": self.worker_id},
        )
        try:
            self.slots = [self._spawn(i) for i in range(self.concurrency)]
            self._heartbeat()
            while not self._finished():
                self._step()
            return 1 if self.hard_stop else 0
        finally:
            self._shutdown_executors(force=self.hard_stop)
            if not self.hard_stop:
                self._db_call(
                    "unregister", lambda c: transitions.unregister_worker(c, self.worker_id)
                )
            self.db.close()
            if self.wakeup is not None:
                self.wakeup.close()
            if previous_handlers:
                self._restore_signal_handlers(previous_handlers)
            logger.info(
                "worker %s stopped: %d claimed, %d done, %d failed, %d leases lost",
                self.worker_id,
                self.stats.claimed,
                self.stats.done,
                self.stats.failed,
                self.stats.lost_leases,
                extra={"worker_id": self.worker_id},
            )

    def request_stop(self) -> None:
        """Stop claiming; let running jobs finish within the grace period. Thread-safe."""
        if not self.stopping:
            self.stopping = True
            self.grace_deadline = time.monotonic() + self.grace
        self._wake()

    def _finished(self) -> bool:
        if self.hard_stop:
            return True
        busy = any(slot.busy for slot in self.slots)
        if busy or (self.outbox and not self._outbox_hopeless()):
            return False
        if self.stopping:
            return True
        if self.max_jobs is not None and self.stats.claimed >= self.max_jobs:
            return True
        return self.burst and not self.queue_may_have_work

    def _outbox_hopeless(self) -> bool:
        # While stopping, don't wait forever for a database that is gone: the reaper will
        # recover whatever these writes would have recorded.
        return (
            self.stopping
            and self.grace_deadline is not None
            and (time.monotonic() > self.grace_deadline + 30)
        )

    # ------------------------------------------------------------------ the loop

    def _step(self) -> None:
        now = time.monotonic()
        if self.outbox:
            self._flush_outbox()
        if now >= self.next_heartbeat:
            self._heartbeat()
        if not self.recovered and now >= self.db_retry_at:
            self._recover_earlier_boots()
        if now >= self.next_poll:
            self.queue_may_have_work = True
        if self.wakeup is not None:
            self.wakeup.ensure()
        self._fill_slots()
        if self._finished():
            return  # e.g. --burst found nothing: exit now, not after one more poll interval
        self._wait(self._next_timeout())
        self._enforce_deadlines()

    def _can_claim(self) -> bool:
        if self.stopping or self.hard_stop:
            return False
        if self.max_jobs is not None and self.stats.claimed >= self.max_jobs:
            return False
        if time.monotonic() < self.db_retry_at:
            return False
        # A worker that cannot prove it is alive may already have been reaped, and its row in
        # the worker registry deleted: take nothing new until a heartbeat registers it again.
        # The clock starts when the last good heartbeat was sent, before the database stamped
        # it, so the worker stops claiming no later than the reaper may judge it gone.
        return time.monotonic() - self.last_heartbeat_ok <= self.worker_timeout

    def _settle(self, settling: workflows.Settling, cursor: Any) -> Any:
        # One slice at a time: a cascade over a million jobs must not stop heartbeats, timeouts
        # or claims. Its progress is the rows' own states, so a crash midway loses nothing
        # (the reaper's repair pass finishes it).
        settling.run(cursor, until=time.monotonic() + SETTLE_SLICE)
        # Settling may have made jobs ready (promoted dependents): claim without waiting.
        self.queue_may_have_work = True
        return None if settling.finished else _AGAIN

    def _free_slot(self) -> Slot | None:
        return next((s for s in self.slots if s.ready and not s.busy), None)

    def _fill_slots(self) -> None:
        while self.queue_may_have_work and self._can_claim():
            slot = self._free_slot()
            if slot is None:
                return
            skip = self._skip_tasks()
            job = self._db_call(
                "claim",
                lambda c, skip=skip: transitions.claim(c, self.worker_id, self.queues, skip),
            )
            if job is _FAILED:
                return
            handed_back = job is not None and job.task not in registry
            self._claimed(slot, job)
            if handed_back:
                # Back to the loop between two of them, so that however many there are,
                # heartbeats and executors are served in between; the next claim comes at once.
                return

    def _claimed(self, slot: Slot, job: ClaimedJob | None) -> None:
        """Start a claimed job in ``slot``; or, if the queue had none, wait for the next poll."""
        if job is None:
            self.queue_may_have_work = False
            self.next_poll = time.monotonic() + self.poll_interval * random.uniform(0.8, 1.2)
            return
        if job.task not in registry:
            # Never hand an executor a name it would have to import. A worker that has the task
            # may exist (a rolling deploy): hand the job back without counting the attempt.
            self._hand_back(job)
            return
        self.stats.claimed += 1
        self._start(slot, job)

    def _start(self, slot: Slot, job: ClaimedJob) -> None:
        logger.info(
            "job %d claimed: task=%s queue=%s attempt=%d/%d",
            job.id,
            job.task,
            job.queue,
            job.attempt,
            job.max_attempts,
            extra={**_job_fields(job, self.worker_id), "event": "claim"},
        )
        holder = next((s for s in self.slots if s.job is not None and s.job.id == job.id), None)
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
                extra=_job_fields(job, self.worker_id),
            )
            if holder.deferred is not None:
                self._lease_lost(holder.deferred, "superseded by a newer claim before it started")
            holder.deferred = job
            self._stop_executor(holder, STOP_LEASE_LOST)
            return
        slot.job = job
        slot.started = time.monotonic()
        slot.deadline = slot.started + job.timeout if job.timeout else None
        slot.stop_reason = None
        slot.kill_at = None
        # If the executor died between jobs, the send fails; its sentinel reports the crash.
        with contextlib.suppress(OSError):
            slot.conn.send(
                Assignment(
                    job_id=job.id,
                    task=job.task,
                    attempt=job.attempt,
                    max_attempts=job.max_attempts,
                    worker_id=self.worker_id,
                    args_json=job.args_json,
                    kwargs_json=job.kwargs_json,
                    lease=job.lease.token,
                )
            )

    def _next_timeout(self) -> float:
        now = time.monotonic()
        moments = [self.next_heartbeat]
        # While claims are held back (a database backoff, no recent heartbeat, stopping), a
        # poll is no reason to wake: what ends the hold is a moment below, or an event.
        if self._can_claim():
            if not self.queue_may_have_work:
                moments.append(self.next_poll)
            elif self._free_slot() is not None:
                moments.append(now)
        if self.outbox:
            soonest = min(write.retry_at for write in self.outbox)
            moments.append(max(self.db_retry_at, soonest))
        elif now < self.db_retry_at:
            moments.append(self.db_retry_at)
        for slot in self.slots:
            if slot.deadline is not None and slot.stop_reason is None:
                moments.append(slot.deadline)
            if slot.kill_at is not None:
                moments.append(slot.kill_at)
        if self.grace_deadline is not None:
            moments.append(self.grace_deadline)
        return max(0.0, min(moments) - now)

    def _wait(self, timeout: float) -> None:
        waitables: list[Any] = [self._wake_r]
        for slot in self.slots:
            waitables.append(slot.conn)
            waitables.append(slot.process.sentinel)
        listen_fd = self.wakeup.fileno() if self.wakeup is not None else None
        if listen_fd is not None:
            waitables.append(listen_fd)
        ready = wait(waitables, timeout)
        if listen_fd is not None and listen_fd in ready and self.wakeup.drain():
            self.queue_may_have_work = True
        if self._wake_r in ready:
            try:
                while self._wake_r.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        for slot in list(self.slots):
            if slot.conn in ready:
                self._receive(slot)
        for slot in list(self.slots):
            if slot.process.sentinel in ready and not slot.process.is_alive():
                self._executor_died(slot)

    def _receive(self, slot: Slot) -> None:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            return  # the sentinel reports the death
        if message == "ready":
            slot.ready = True
            return
        job = slot.job
        if job is None or not isinstance(message, Report) or message.job_id != job.id:
            logger.error("executor %d sent an unexpected message: %r", slot.index, message)
            return
        # Record what the job did even if it was being stopped at that moment: a finished job's
        # result beats a timeout. If the lease was lost meanwhile, the fenced write says so.
        elapsed = time.monotonic() - slot.started
        slot.job = None
        slot.deadline = None
        # The job may have made work ready (children it spawned, dependents its end promotes):
        # look again (with the finish, in the same round trip) rather than wait for a poll.
        self.queue_may_have_work = True
        self._record(job, message, elapsed)

    def _executor_died(self, slot: Slot) -> None:
        job = slot.job
        code = slot.process.exitcode
        elapsed = time.monotonic() - slot.started
        reason = slot.stop_reason
        if job is not None:
            if reason == STOP_TIMEOUT:
                self._record(
                    job,
                    Report(
                        job.id,
                        Outcome.TIMEOUT,
                        error=f"timed out after {job.timeout}s and was stopped",
                    ),
                    elapsed,
                )
            elif reason == STOP_CANCELLED:
                self._record(
                    job, Report(job.id, Outcome.CANCELLED, error="cancelled while running"), elapsed
                )
            elif reason == STOP_SHUTDOWN:
                self._release(job.lease, _job_fields(job, self.worker_id))
            elif reason == STOP_LEASE_LOST:
                self._lease_lost(job, "stopped: its lease was lost", elapsed)
            else:
                self._record(
                    job,
                    Report(
                        job.id,
                        Outcome.CRASHED,
                        error=f"the job's process died ({_describe_exit(code)})",
                    ),
                    elapsed,
                )
        elif reason is None and not self.stopping:
            logger.warning(
                "executor %d exited (%s); replacing it", slot.index, _describe_exit(code)
            )
        slot.conn.close()
        deferred, slot.deferred = slot.deferred, None
        if not (self.stopping or self.hard_stop):
            replacement = self._spawn(slot.index)
            self.slots[self.slots.index(slot)] = replacement
            if deferred is not None:
                self._start(replacement, deferred)
        else:
            self.slots.remove(slot)
            if deferred is not None:
                self._release(deferred.lease, _job_fields(deferred, self.worker_id))

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.job is None:
                continue
            if slot.deadline is not None and now >= slot.deadline and slot.stop_reason is None:
                logger.warning(
                    "job %d timed out after %ss: stopping it",
                    slot.job.id,
                    slot.job.timeout,
                    extra=_job_fields(slot.job, self.worker_id),
                )
                self._stop_executor(slot, STOP_TIMEOUT)
            if (
                self.grace_deadline is not None
                and now >= self.grace_deadline
                and slot.stop_reason is None
            ):
                logger.warning(
                    "job %d still running at the end of the grace period: releasing it",
                    slot.job.id,
                    extra=_job_fields(slot.job, self.worker_id),
                )
                self._stop_executor(slot, STOP_SHUTDOWN)
            if slot.kill_at is not None and now >= slot.kill_at and slot.process.is_alive():
                slot.process.kill()
                slot.kill_at = None

    def _stop_executor(self, slot: Slot, reason: str) -> None:
        slot.stop_reason = reason
        slot.kill_at = time.monotonic() + self.kill_grace
        slot.ready = False
        if slot.process.is_alive():
            slot.process.terminate()

    # ------------------------------------------------------------------ queue writes

    def _record(self, job: ClaimedJob, report: Report, elapsed: float) -> None:
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
        self._queue_finish(job, report.outcome, options, elapsed)

    def _queue_finish(
        self,
        job: ClaimedJob,
        outcome: str,
        options: dict[str, Any],
        elapsed: float,
        *,
        replay: bool = False,
    ) -> None:
        self.unwritten.add(job.id)
        self.outbox.append(self._finish_write(job, outcome, options, elapsed, replay=replay))
        self._flush_outbox()

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

        def write(cursor: Any) -> Callable[[], None] | None:
            nonlocal tries
            tries += 1
            # A busy worker claims its next job in the same round trip as this finish.
            slot = self._free_slot() if self.queue_may_have_work and self._can_claim() else None
            if slot is None:
                ended = transitions.finish(cursor, job.lease, outcome, **options)
                then = None
            else:
                ended, claimed = transitions.finish_and_claim(
                    cursor, job.lease, outcome, self.queues, self._skip_tasks(), **options
                )
                then = functools.partial(self._claimed, slot, claimed)
            if ended is None:
                if (tries > 1 or replay) and transitions.attempt_outcome(
                    cursor, job.lease
                ) == outcome:
                    # An earlier try committed, and only its reply was lost.
                    logger.info(
                        "job %d: outcome %s was already recorded",
                        job.id,
                        outcome,
                        extra={**_job_fields(job, self.worker_id), "event": "finish"},
                    )
                    self._queue_settle(job.id)
                else:
                    self._lease_lost(job, f"could not record outcome {outcome}", elapsed)
                return then
            self.remembered[job.id] = Remembered(
                job.lease.token,
                functools.partial(self._queue_finish, job, outcome, options, elapsed, replay=True),
            )
            if ended.needs_settling:
                self._queue_settle(job.id)
            self._log_outcome(job, outcome, options, ended.state, elapsed)
            return then

        def plain_error(exc: BaseException | None) -> Write:
            # The outcome itself cannot be stored (text PostgreSQL refuses, say): record a plain
            # error that says so, rather than leave the job running with nobody to finish it.
            reason = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
            error = storable_text(f"the worker could not record outcome {outcome}: {reason}"[:2000])
            plain = {"error": error, "retryable": False, "retry_delay": 0.0}
            return self._finish_write(job, Outcome.ERROR, plain, elapsed, fallback=False)

        if fallback:
            return Write(f"finish job {job.id}", write, job.id, plain_error)
        return Write(f"finish job {job.id}", write, job.id, droppable=False)

    def _queue_settle(self, job_id: int) -> None:
        # After the finish has committed, in statements of their own (workflows.py).
        settling = workflows.Settling.of(job_id)
        self.outbox.append(
            Write(
                f"settle job {job_id}", functools.partial(self._settle, settling), settling=settling
            )
        )

    def _log_outcome(
        self, job: ClaimedJob, outcome: str, options: dict[str, Any], state: str, elapsed: float
    ) -> None:
        fields = {
            **_job_fields(job, self.worker_id),
            "duration": round(elapsed, 3),
            "outcome": outcome,
            "event": "retry" if state == "pending" else "finish",
            "state": state,
        }
        if state == "done":
            self.stats.done += 1
            logger.info("job %d done in %.3fs", job.id, elapsed, extra=fields)
        elif state == "waiting":
            self.stats.done += 1
            logger.info(
                "job %d returned in %.3fs; waiting for its children", job.id, elapsed, extra=fields
            )
        elif state == "pending":
            self.stats.failed += 1
            logger.warning(
                "job %d attempt %d failed (%s): %s; retrying in %.1fs",
                job.id,
                job.attempt,
                outcome,
                options["error"],
                options["retry_delay"],
                extra=fields,
            )
        else:
            self.stats.failed += 1
            logger.warning(
                "job %d ended %s after %d attempt(s) (%s): %s",
                job.id,
                state,
                job.attempt,
                outcome,
                options["error"],
                extra=fields,
            )

    def _release(
        self, lease: Lease, fields: dict[str, Any], reason: str = "released at worker shutdown"
    ) -> None:
        def write(cursor: Any) -> None:
            if transitions.release(cursor, lease, reason):
                logger.info(
                    "job %d released for another worker",
                    lease.job_id,
                    extra={**fields, "event": "release"},
                )
            else:
                self.stats.lost_leases += 1
                logger.warning(
                    "job %d lease lost (attempt %d): could not be released",
                    lease.job_id,
                    lease.attempt,
                    extra={**fields, "event": "lease_lost"},
                )

        self.unwritten.add(lease.job_id)
        self.outbox.append(Write(f"release job {lease.job_id}", write, lease.job_id))
        self._flush_outbox()

    def _hand_back(self, job: ClaimedJob) -> None:
        """Give back a job whose task this worker has not registered (transitions.hand_back);
        end it in error once it has waited JOBS_UNKNOWN_TASK_TIMEOUT for a worker that has."""
        give_up_after = conf.unknown_task_timeout()

        def write(cursor: Any) -> None:
            handed = transitions.hand_back(
                cursor,
                job.lease,
                job.task,
                give_up_after=give_up_after,
                worker_timeout=self.worker_timeout,
                seen_since=self.missing_since.get(job.task),
            )
            verdict = handed.verdict if handed is not None else None
            if handed is not None:
                self.missing_since.setdefault(job.task, handed.missing_since)
            if verdict == transitions.HANDED_BACK:
                self.missing_tasks[job.task] = time.monotonic() + conf.unknown_task_delay()
                self._handed_back(job.task)
            elif verdict == transitions.EXPIRED:
                error = (
                    f"{_unknown(job.task)} No live worker has registered it for"
                    f" {give_up_after:g}s (JOBS_UNKNOWN_TASK_TIMEOUT)."
                )
                options = {"error": error[:2000], "retryable": False, "retry_delay": 0.0}
                self._queue_finish(job, Outcome.ERROR, options, 0.0)
            else:
                self._lease_lost(job, "could not hand it back")

        self.unwritten.add(job.id)
        self.outbox.append(Write(f"hand back job {job.id}", write, job.id))
        self._flush_outbox()

    def _skip_tasks(self) -> list[str]:
        """The tasks whose jobs claims pass over for now: those this worker has just handed
        back a job of. Once the pause is over it looks again, to give up on jobs that no worker
        has taken for JOBS_UNKNOWN_TASK_TIMEOUT."""
        now = time.monotonic()
        for task, until in list(self.missing_tasks.items()):
            if until <= now:
                del self.missing_tasks[task]
        return sorted(self.missing_tasks)

    def _handed_back(self, task: str) -> None:
        # A line per task a minute, not one per job: a deploy may hand back thousands.
        self.handed_back[task] += 1
        now = time.monotonic()
        if now - self.handed_back_logged_at.get(task, float("-inf")) < 60:
            return
        self.handed_back_logged_at[task] = now
        logger.warning(
            "handed back %d job(s) of task %r: it is not registered in this worker, which passes"
            " over its jobs for %gs at a time; a worker that has it runs them",
            self.handed_back.pop(task),
            task,
            conf.unknown_task_delay(),
            extra={"worker_id": self.worker_id, "task": task, "event": "hand_back"},
        )

    def _recover_earlier_boots(self) -> None:
        """Recover jobs left running by an earlier boot of this worker's name on this host (a
        container restarted in its pod keeps the pod name): that boot is certainly gone."""

        def recover(cursor: Any) -> list[Any]:
            candidates = []
            for job in transitions.running_jobs(cursor, conf.timeout_grace()):
                earlier = job.lease.worker_id
                if earlier == self.worker_id or name_of(earlier) != self.name:
                    continue
                same_host = job.host == self.info.host
                if job.unregistered or (
                    same_host and (job.pid == self.info.pid or not _pid_alive(job.pid))
                ):
                    reason = f"worker restarted: earlier boot {earlier} is gone"
                    candidates.append((job, Outcome.LOST, reason, None))
            return end_attempts(cursor, candidates)

        if self._db_call("startup recovery", recover) is not _FAILED:
            self.recovered = True

    def _recover_orphans(self, orphans: list[Lease], remembered: dict[int, Remembered]) -> None:
        """Deal with jobs running under this worker's id that it does not run (see
        transitions.heartbeat). Neither case is the job's fault, so neither costs an attempt:
        a finish the database lost is written again from memory (it is fenced on the lease, so
        writing it twice is safe); any other orphan is a claim whose reply never reached this
        worker, and is released."""
        for lease in orphans:
            fields = {
                "job_id": lease.job_id,
                "attempt": lease.attempt,
                "worker_id": lease.worker_id,
            }
            known = remembered.get(lease.job_id)
            if known is not None and known.token == lease.token:
                logger.warning(
                    "job %d: the database lost its recorded outcome (a crash or failover);"
                    " writing it again",
                    lease.job_id,
                    extra={**fields, "event": "replay"},
                )
                known.replay()
            else:
                logger.warning(
                    "job %d is running under this worker in the database, but this worker never"
                    " started it (the claim's reply was lost); releasing it without counting"
                    " the attempt",
                    lease.job_id,
                    extra={**fields, "event": "orphan"},
                )
                self._release(lease, fields, reason="released: its worker never got the claim")

    def _lease_lost(self, job: ClaimedJob, what: str, elapsed: float | None = None) -> None:
        self.stats.lost_leases += 1
        fields: dict[str, Any] = {**_job_fields(job, self.worker_id), "event": "lease_lost"}
        if elapsed is not None:
            fields["duration"] = round(elapsed, 3)
        logger.warning(
            "job %d lease lost (attempt %d): %s; another run owns the job now",
            job.id,
            job.attempt,
            what,
            extra=fields,
        )

    def _flush_outbox(self) -> None:
        """Make the writes that are due, oldest first. A write that fails waits on its own
        backoff while the others go on; only an outage (the connection is gone) stops them all,
        until the connection's backoff has passed. A write queued meanwhile (by what a write
        does next: start the job claimed with a finish, say) waits for the next flush, so that
        nothing recurses job after job."""
        if self.flushing:
            return
        self.flushing = True
        try:
            self._flush_due_writes()
        finally:
            self.flushing = False

    def _flush_due_writes(self) -> None:
        for write in list(self.outbox):
            now = time.monotonic()
            if now < self.db_retry_at:
                return
            if write.retry_at > now or write not in self.outbox:
                continue
            then = self._db_call(write.description, write.run, own_backoff=True)
            if then is _AGAIN:
                assert write.settling is not None
                write.failures = 0
                write.retry_at = write.settling.next_due()
                continue
            if then is not _FAILED:
                self.outbox.remove(write)
                self._written(write.job_id)
                if callable(then):
                    then()  # e.g. start the job claimed together with a finish
                continue
            if self.db.broken:
                return
            self._write_failed(write)

    def _write_failed(self, write: Write) -> None:
        write.failures += 1
        write.retry_at = time.monotonic() + backoff(write.failures)
        if self.last_error_transient or write.failures < 5:
            return  # a bounded wait ran out: try again, for as long as it takes
        # Not an outage but a write that keeps failing: do something simpler, or give up.
        index = self.outbox.index(write)
        if write.fallback is not None:
            logger.error(
                "%s failed %d times; recording a plain error instead",
                write.description,
                write.failures,
            )
            self.outbox[index] = write.fallback(self.last_db_error)
        elif write.droppable:
            logger.error("giving up on %s after %d failures", write.description, write.failures)
            del self.outbox[index]
            self._written(write.job_id)

    def _written(self, job_id: int | None) -> None:
        if job_id is not None and not any(w.job_id == job_id for w in self.outbox):
            self.unwritten.discard(job_id)

    def _leases(self) -> list[Lease]:
        """The leases of every job this worker runs or is about to start."""
        return [
            job.lease for slot in self.slots for job in (slot.job, slot.deferred) if job is not None
        ]

    def _heartbeat(self) -> None:
        sent = time.monotonic()
        self.next_heartbeat = sent + self.heartbeat_interval
        leases = self._leases()
        unwritten = sorted(self.unwritten)
        # Every finish remembered now committed before this heartbeat: if the heartbeat does not
        # list its job as an orphan, the database still has it, and it need not be kept.
        remembered = self.remembered
        beat = self._db_call(
            "heartbeat", lambda c: transitions.heartbeat(c, self.info, leases, unwritten)
        )
        if beat is _FAILED:
            # Try again with the same backoff as other writes, not a whole interval later: after
            # an outage, a lost lease must be noticed (and its executor stopped) soon.
            self.next_heartbeat = min(self.next_heartbeat, self.db_retry_at)
            return
        self.last_heartbeat_ok = sent
        self.remembered = {}
        if beat.orphans:
            self._recover_orphans(beat.orphans, remembered)
        statuses = beat.leases
        for slot in self.slots:
            job = slot.job
            if job is None or slot.stop_reason is not None:
                continue
            status = statuses.get(job.lease.token) if job.lease.token else None
            if status is None or not status.held:
                self._stop_executor(slot, STOP_LEASE_LOST)
            elif status.cancel_requested:
                logger.info(
                    "job %d cancellation requested: stopping it",
                    job.id,
                    extra=_job_fields(job, self.worker_id),
                )
                self._stop_executor(slot, STOP_CANCELLED)

    def _db_call(
        self, description: str, fn: Callable[[Any], Any], *, own_backoff: bool = False
    ) -> Any:
        """Run ``fn(cursor)``; on a database error, back off and return ``_FAILED``.

        An outage (the connection broke) backs off every use of the database. Any other error
        backs off every use too, unless ``own_backoff``: an outbox write waits on its own.
        """
        try:
            with self.db.cursor() as cursor:
                result = fn(cursor)
        except Exception as exc:
            self.last_db_error = exc
            # An outage or a bounded wait running out is retried for as long as it takes.
            self.last_error_transient = is_connection_fatal(exc) or db.is_timeout(exc)
            if own_backoff and not self.db.broken:
                logger.log(
                    logging.WARNING if self.last_error_transient else logging.ERROR,
                    "database error during %s (%s: %s); trying it again later",
                    description,
                    type(exc).__name__,
                    _first_line(exc),
                )
                return _FAILED
            self.db_failures += 1
            delay = backoff(self.db_failures, OUTAGE_RETRY_CAP)
            self.db_retry_at = time.monotonic() + delay
            unlogged = self.db_complaints.due(exc)
            if unlogged is not None:
                logger.log(
                    logging.WARNING if self.last_error_transient else logging.ERROR,
                    "database error during %s (%s: %s); retrying in %.1fs%s",
                    description,
                    type(exc).__name__,
                    _first_line(exc),
                    delay,
                    f" ({unlogged} more failed tries since the last report)" if unlogged else "",
                )
            return _FAILED
        if self.db_failures:
            logger.info("database reachable again after %d failed attempt(s)", self.db_failures)
            self.db_complaints.reset()
        self.db_failures = 0
        self.db_retry_at = 0.0
        return result

    # ------------------------------------------------------------------ executors

    def _spawn(self, index: int) -> Slot:
        parent_conn, child_conn = self._mp.Pipe(duplex=True)
        process = self._mp.Process(
            target=executor_main,
            args=(child_conn, _picklable_databases(), os.environ.get("DJANGO_SETTINGS_MODULE", "")),
            name=f"django-jobs-executor-{index}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return Slot(index=index, process=process, conn=parent_conn)

    def _shutdown_executors(self, *, force: bool) -> None:
        for slot in self.slots:
            if force:
                slot.process.kill()
            else:
                with contextlib.suppress(OSError):
                    slot.conn.send(None)
        deadline = time.monotonic() + 5
        for slot in self.slots:
            slot.process.join(max(0.0, deadline - time.monotonic()))
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(1)
            slot.conn.close()

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_signal)
        previous[-1] = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        signal.set_wakeup_fd(previous.pop(-1))
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            logger.warning("%s again: exiting now; the reaper will recover running jobs", name)
            self.hard_stop = True
        else:
            running = sum(1 for slot in self.slots if slot.busy)
            logger.info(
                "%s: no new jobs; waiting up to %.0fs for %d running job(s)",
                name,
                self.grace,
                running,
            )
            self.request_stop()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")


_FAILED: Any = object()
# What a write returns when it has more to do: it stays in the outbox, and goes on later.
_AGAIN: Any = object()
#: Seconds of settling (workflows.Settling) between two looks at the rest of the loop.
SETTLE_SLICE = 0.05


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _unknown(task: str) -> Exception:
    from django_jobs.exceptions import UnknownTask

    return UnknownTask(task)


def _job_fields(job: ClaimedJob, worker_id: str) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "attempt": job.attempt,
        "worker_id": worker_id,
    }


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _picklable_databases() -> dict[str, Any]:
    # Settings dicts are plain data; a round trip through JSON proves it before a spawn fails.
    databases = settings.DATABASES
    try:
        json.dumps(databases)
        return databases
    except TypeError:
        return {
            alias: {k: v for k, v in db.items() if _plain(v)} for alias, db in databases.items()
        }


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False
