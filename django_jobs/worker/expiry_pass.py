"""The worker's expiry pass: every ``JOBS_EXPIRY_INTERVAL`` seconds (jittered), the pending jobs
whose deadline
(``expires_at``) has passed end cancelled, as expired, and their dependents with them
(:func:`django_jobs.workflows.expire_due`). The claim never takes such a job whether or not this
pass has run; the pass makes the job's end visible, within an interval of its deadline.

One indexed probe a pass (job_expiry_idx holds only pending jobs with a deadline, so it is
empty without deadlines), sent through the :class:`~django_jobs.worker.postgres_queue.QueueGate`
on the worker's own connection while the loop goes on, with a backoff of its own on errors: a
pass that keeps failing never holds back the worker's jobs. Any number of workers may run it at
once: each locks the jobs it ends SKIP LOCKED. The reaper (``manage.py reapjobs``) runs the same
pass, for deployments whose workers all go through the HTTP API.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from django_jobs import conf
from django_jobs.runtime.backoff import Backoff
from django_jobs.store import EXPIRE_BATCH
from django_jobs.worker.duties import DatabaseDuties
from django_jobs.worker.postgres_queue import FAILED, QueueGate

logger = logging.getLogger("django_jobs.expiry")

#: Seconds between passes while a pass ends a full batch: more are due.
CATCH_UP_WAIT = 0.05
#: The longest wait before trying again after a failure.
FAILURE_RETRY_CAP = 60.0
#: Seconds before trying again after an outage, at the least.
OUTAGE_RETRY = 1.0


class ExpiryPass:
    """End expired jobs from a worker's loop; never without ``duties`` (a worker of the HTTP
    API, whose server's reaper does it) or with ``JOBS_EXPIRY_INTERVAL = 0``."""

    def __init__(
        self, duties: DatabaseDuties | None, gate: QueueGate, *, interval: float | None = None
    ) -> None:
        self.duties = duties
        self.gate = gate
        self.interval = conf.expiry_interval() if interval is None else interval
        enabled = duties is not None and self.interval > 0
        self.due_at = (
            time.monotonic() + random.uniform(0, self.interval) if enabled else float("inf")
        )
        self.in_flight = False
        self.backoff = Backoff(FAILURE_RETRY_CAP)
        #: Jobs this worker ended as expired.
        self.expired = 0

    def step(self, stopping: bool = False) -> None:
        """Send a pass, if one is due."""
        if stopping:
            self.due_at = float("inf")
        duties = self.duties
        if duties is None or self.in_flight or time.monotonic() < self.due_at:
            return
        if self.gate.waiting():  # the database is away: look again when the queue does
            self.due_at = max(self.due_at, self.gate.retry_at)
            return
        self.in_flight = True
        self.gate.send("expiry", duties.expire_due, self._done, own_backoff=True)

    def _done(self, ended: Any) -> None:
        self.in_flight = False
        now = time.monotonic()
        if self.due_at == float("inf"):  # the worker began to stop meanwhile
            return
        if ended is FAILED:
            # An outage waits for the queue's own backoff (its end is the database back); any
            # other error backs off the expiry alone.
            if self.gate.queue.broken:
                self.due_at = max(now + OUTAGE_RETRY, self.gate.retry_at)
            else:
                self.due_at = now + self.backoff.failed()
            return
        self.backoff.succeeded()
        if ended:
            self.expired += len(ended)
            logger.info(
                "ended %d job(s) past their deadline, cancelled as expired: %s",
                len(ended),
                ", ".join(f"#{job_id}" for job_id in ended[:20]),
            )
        full = len(ended) >= EXPIRE_BATCH
        self.due_at = now + (CATCH_UP_WAIT if full else self.interval * random.uniform(0.8, 1.2))
