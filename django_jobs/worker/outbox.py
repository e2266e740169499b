"""The outbox: the writes a worker owes its queue, kept until each has committed.

A job's finish, a release, a hand-back or the settling that follows a job's end goes into the
outbox and is written from there, so that a job's result survives a database restart: while the
database is away, the writes wait, and the job's executor is free for the next job.

A write that fails waits on its own backoff while the others go on; only an outage (the
connection is gone) stops them all, until the queue's shared backoff has passed. A write that
keeps failing for another reason (not a lock wait running out) is replaced by a simpler one (its
fallback), or else dropped. A write queued while the outbox is being flushed (by what a write
does once it has committed: start the job claimed together with a finish, say) waits for the
next flush, so that nothing recurses job after job.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from django_jobs import workflows
from django_jobs.exceptions import ApiRefused
from django_jobs.runtime.backoff import Backoff
from django_jobs.worker.postgres_queue import FAILED, QueueGate

logger = logging.getLogger("django_jobs.worker")

#: Failures of a write (not counting outages and lock waits) before its fallback replaces it.
FALLBACK_AFTER = 5


@dataclasses.dataclass(eq=False)
class Write:
    """A write to the queue, kept in the outbox until it has committed."""

    description: str
    # Makes the write; raises on a database error, to be tried again later.
    run: Callable[[], Any]
    # What follows once it has committed, given what ``run`` returned; outside the error
    # handling, since the write must not be made again.
    then: Callable[[Any], None] | None = None
    # The job it ends, if any: that job is no orphan while the write waits.
    job_id: int | None = None
    # A simpler write to make instead if this one keeps failing (not an outage).
    fallback: Callable[[BaseException | None], Write] | None = None
    # Whether to drop the write if it keeps failing, and has no fallback. A job's last-resort
    # finish is never dropped: its job would be left running with nobody to finish it.
    droppable: bool = True
    # Failures of this write that were not an outage (a lock wait that ran out, say), and when
    # to try it again: each write backs off on its own, so one never holds back the others.
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    # For the settling that follows a job's end: it runs a slice at a time, and stays in the
    # outbox until it has finished.
    settling: workflows.Settling | None = None
    # For a write sent while the loop goes on (a job's finish; see round_trip.py): called on the
    # loop's thread when the write is made, it returns the call that makes it, which touches
    # nothing but the queue (it may run on another thread). ``run`` is then ``send()()``.
    send: Callable[[], Callable[[], Any]] | None = None


class Outbox:
    """The writes owed, in the order they were queued."""

    def __init__(self, gate: QueueGate) -> None:
        self.gate = gate
        self.writes: collections.deque[Write] = collections.deque()
        # Jobs this worker has ended whose write is still in the outbox: not orphans.
        self.unwritten: set[int] = set()
        # Set while the outbox is being flushed: a write queued meanwhile waits for the next
        # flush instead of starting one of its own, so that nothing recurses job after job.
        self.flushing = False

    def __bool__(self) -> bool:
        return bool(self.writes)

    def add(self, write: Write) -> None:
        """Queue ``write``, after the others; :meth:`flush` makes it."""
        if write.job_id is not None:
            self.unwritten.add(write.job_id)
        self.writes.append(write)

    def finishes(self) -> int:
        """How many of the writes owed are finishes, each with a claim for a free slot."""
        return sum(1 for write in self.writes if write.send is not None)

    def next_due(self) -> float | None:
        """When (monotonic) the soonest write is due, if there is one."""
        return min((write.backoff.retry_at for write in self.writes), default=None)

    def flush(self) -> None:
        """Make the writes that are due, oldest first (see the module's docstring)."""
        if self.flushing:
            return
        self.flushing = True
        try:
            self._flush_due_writes()
        finally:
            self.flushing = False

    def _flush_due_writes(self) -> None:
        for write in list(self.writes):
            # A write in flight (round_trip.py) holds back the others until it is back: one
            # round trip at a time on the connection, and the writes in the order queued.
            if self.gate.waiting() or self.gate.busy:
                return
            if write.backoff.waiting() or write not in self.writes:
                continue
            if write.send is not None:
                made = functools.partial(self._sent_back, write)
                self.gate.send(write.description, write.send(), made, own_backoff=True)
            else:
                result = self.gate.call(write.description, write.run, own_backoff=True)
                self._made(write, result)
                if result is FAILED and self.gate.queue.broken:
                    return

    def _sent_back(self, write: Write, result: Any) -> None:
        # Handled when the loop collects it, maybe inside another flush, maybe not: what the
        # write does once it has committed queues its own writes for the next flush, as above.
        flushing, self.flushing = self.flushing, True
        try:
            self._made(write, result)
        finally:
            self.flushing = flushing

    def _made(self, write: Write, result: Any) -> None:
        if result is FAILED:
            if not self.gate.queue.broken:  # an outage holds back every write (gate.waiting())
                self._failed(write)
        elif write.settling is not None and not write.settling.finished:
            write.backoff.wait_until(write.settling.next_due())
        else:
            self.writes.remove(write)
            self._written(write.job_id)
            if write.then is not None:
                write.then(result)  # e.g. start the job claimed together with a finish

    def _failed(self, write: Write) -> None:
        write.backoff.failed()
        # A write the HTTP API refused (a 4xx) would be refused again: never sent again.
        final = isinstance(self.gate.last_error, ApiRefused)
        if not final and (
            self.gate.last_error_transient or write.backoff.failures < FALLBACK_AFTER
        ):
            return  # a bounded wait ran out: try again, for as long as it takes
        # Not an outage but a write that keeps failing: do something simpler, or give up.
        index = self.writes.index(write)
        if write.fallback is not None:
            logger.error(
                "%s failed %d times; recording a plain error instead",
                write.description,
                write.backoff.failures,
            )
            self.writes[index] = write.fallback(self.gate.last_error)
        elif write.droppable or final:
            # A finish the API refused is dropped too: the reaper recovers its job.
            logger.error(
                "giving up on %s after %d failures", write.description, write.backoff.failures
            )
            del self.writes[index]
            self._written(write.job_id)

    def _written(self, job_id: int | None) -> None:
        if job_id is not None and not any(w.job_id == job_id for w in self.writes):
            self.unwritten.discard(job_id)
