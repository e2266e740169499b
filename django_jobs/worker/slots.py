"""An executor's slot in the pool, and the events the pool turns its executors' messages and
exits into for the supervisor.

A slot holds one executor process, its pipes, and the job it runs (with its deadline, and why
the pool is stopping it, if it is). :class:`Reported` says a job's end was reported;
:class:`Exited` says an executor process has exited, and with what end for its job.
"""

from __future__ import annotations

import dataclasses
import signal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from django_jobs.states import Outcome
from django_jobs.store import ClaimedJob
from django_jobs.worker.executor import Report
from django_jobs.worker.live import Watch
from django_jobs.worker.spawn import ExecutorEnd

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
    conn: ExecutorEnd
    # The read end of the executor's output pipe (None: its output is not captured), and how
    # many bytes have been read from it.
    output: Connection | None = None
    output_read: int = 0
    ready: bool = False
    job: ClaimedJob | None = None
    started: float = 0.0
    deadline: float | None = None
    stop_reason: str | None = None
    kill_at: float | None = None
    # A newer claim of the job that this slot's executor still runs under an older lease: it
    # starts here once that executor has exited, so that the job never runs twice at once.
    deferred: ClaimedJob | None = None
    # What the running job has reported and printed so far.
    watch: Watch | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None or self.deferred is not None

    @property
    def pid(self) -> int:
        """The executor's process id (its process is started when the slot is made)."""
        pid = self.process.pid
        assert pid is not None, "the executor has not been started"
        return pid


@dataclasses.dataclass(frozen=True)
class Reported:
    """An executor reported the end of its job; the slot is free again."""

    slot: Slot
    job: ClaimedJob
    report: Report
    elapsed: float
    watch: Watch | None = None


@dataclasses.dataclass(frozen=True)
class Exited:
    """An executor process has exited, with or without a job, and needs replacing."""

    slot: Slot
    job: ClaimedJob | None
    reason: str | None  # why the pool stopped it, if it did: one of the STOP_* reasons
    code: int | None
    elapsed: float
    #: What the job had reported and printed up to the end.
    watch: Watch | None = None

    def report(self, job: ClaimedJob) -> Report:
        """The end of the attempt of ``job``, whose executor was stopped for a timeout or a
        cancellation, or died."""
        if self.reason == STOP_TIMEOUT:
            return Report(
                job.id, Outcome.TIMEOUT, error=f"timed out after {job.timeout}s and was stopped"
            )
        if self.reason == STOP_CANCELLED:
            return Report(job.id, Outcome.CANCELLED, error="cancelled while running")
        return Report(job.id, Outcome.CRASHED, error=f"the job's process died ({self.how()})")

    def how(self) -> str:
        """How the process ended, in words."""
        if self.code is None:
            return "still running"
        if self.code < 0:
            try:
                return f"killed by {signal.Signals(-self.code).name}"
            except ValueError:
                return f"killed by signal {-self.code}"
        return f"exit code {self.code}"


Event = Reported | Exited
