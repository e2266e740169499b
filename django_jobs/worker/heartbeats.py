"""The worker's heartbeat: one statement that proves the worker alive and checks its leases.

Each beat registers the worker (:func:`this_worker`), and answers for every job it runs whether
its lease still holds and whether its cancellation was requested; a run whose lease was lost or
whose job is being cancelled is stopped. It also lists the jobs running under the worker's id
that the worker does not know (orphans: a claim whose reply was lost, a finish the database
lost), which :meth:`~django_jobs.worker.writes.JobWrites.recover_orphans` deals with.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence

from django_jobs.registry import registry
from django_jobs.store import WorkerInfo
from django_jobs.worker.fence import clock
from django_jobs.worker.outbox import Outbox
from django_jobs.worker.outcomes import OutcomeLog
from django_jobs.worker.postgres_queue import FAILED, Queue, QueueGate
from django_jobs.worker.process_pool import ExecutorPool
from django_jobs.worker.slots import STOP_CANCELLED, STOP_LEASE_LOST
from django_jobs.worker.writes import JobWrites

logger = logging.getLogger("django_jobs.worker")


def this_worker(worker_id: str, name: str, queues: Sequence[str], concurrency: int) -> WorkerInfo:
    """What a worker's heartbeat registers of this process: where it runs, what it serves, and
    the tasks it has."""
    return WorkerInfo(
        id=worker_id,
        name=name,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=list(queues),
        concurrency=concurrency,
        pod=os.environ.get("POD_NAME", ""),
        tasks=registry.local_names(),
    )


class Heartbeats:
    """The heartbeats of the worker ``info``, every ``interval`` seconds."""

    def __init__(
        self,
        info: WorkerInfo,
        db: Queue,
        gate: QueueGate,
        pool: ExecutorPool,
        outbox: Outbox,
        writes: JobWrites,
        log: OutcomeLog,
        *,
        interval: float,
        worker_timeout: float,
    ) -> None:
        self.info = info
        self.db = db
        self.gate = gate
        self.pool = pool
        self.outbox = outbox
        self.writes = writes
        self.log = log
        self.interval = interval
        self.worker_timeout = worker_timeout
        #: When the next beat is due (time.monotonic()).
        self.next_at = 0.0
        #: When the last beat that succeeded was sent. No claim before the first heartbeat has
        #: registered this worker.
        self.last_ok = float("-inf")

    def alive(self) -> bool:
        """Whether the worker can prove it is alive. One that cannot may already have been
        reaped, and its row in the worker registry deleted: it takes nothing new until a
        heartbeat registers it again."""
        # The clock starts when the last good heartbeat was sent, before the database stamped
        # it, so the worker stops claiming no later than the reaper may judge it gone; nor
        # after its executors would stop a job they started (worker/fence.py).
        return time.monotonic() - self.last_ok <= min(self.worker_timeout, self.pool.fence.after)

    def beat(self) -> None:
        """Send a heartbeat; recover the orphans it finds, and stop the runs it disowns."""
        # A finish in flight may have claimed a job: start it first, so that the beat lists it
        # (an unlisted job running under this worker's id is an orphan).
        self.gate.settle()
        sent = time.monotonic()
        sent_by_fence_clock = clock()
        self.next_at = sent + self.interval
        leases = self.pool.leases()
        unwritten = sorted(self.outbox.unwritten)
        # Every finish remembered now committed before this heartbeat: if the heartbeat does not
        # list its job as an orphan, the database still has it, and it need not be kept.
        remembered = self.writes.remembered
        beat = self.gate.call("heartbeat", lambda: self.db.heartbeat(self.info, leases, unwritten))
        if beat is FAILED:
            # Try again with the same backoff as other writes, not a whole interval later: after
            # an outage, a lost lease must be noticed (and its executor stopped) soon.
            self.next_at = min(self.next_at, self.gate.retry_at)
            return
        self.last_ok = sent
        self.pool.fence.committed(sent_by_fence_clock)
        self.writes.remembered = {}
        if beat.orphans:
            self.writes.recover_orphans(beat.orphans, remembered)
        for slot in self.pool.running():
            job = slot.job
            assert job is not None
            status = beat.leases.get(job.lease.token) if job.lease.token else None
            if status is None or not status.held:
                self.pool.stop(slot, STOP_LEASE_LOST)
            elif status.cancel_requested:
                logger.info(
                    "job %d cancellation requested: stopping it", job.id, extra=self.log.fields(job)
                )
                self.pool.stop(slot, STOP_CANCELLED)
