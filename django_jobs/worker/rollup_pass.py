"""The worker's periodic rollup pass (:mod:`django_jobs.rollups`): every
``JOBS_ROLLUP_INTERVAL`` seconds (jittered), a look at whether an hour has closed that is not
rolled up yet (one read of one row); if one has, that hour is rolled up, then the next, a pass
at a time, until the rollups have caught up.

A pass is sent through the :class:`~django_jobs.worker.postgres_queue.QueueGate` on the worker's
own connection, while the loop goes on (where the gate can), and it meets errors there with a
backoff of its own: rollups that keep failing never hold back the worker's jobs. Any number of
workers may look at once: a pass that finds another under way writes nothing, at once.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import timedelta
from typing import Any

from django_jobs import conf
from django_jobs.runtime.backoff import Backoff
from django_jobs.worker.duties import DatabaseDuties
from django_jobs.worker.postgres_queue import FAILED, QueueGate

logger = logging.getLogger("django_jobs.rollups")

#: The hours one pass of a worker covers: one, so that a pass stays short.
WORKER_SPAN = timedelta(hours=1)
#: Seconds between passes while catching up.
CATCH_UP_WAIT = 0.2
#: Seconds before trying again after an outage, at the least.
OUTAGE_RETRY = 1.0
#: The longest wait before trying again after a failure that is not an outage.
FAILURE_RETRY_CAP = 300.0


class RollupPass:
    """Roll up closed hours from a worker's loop; never without ``duties`` (a worker of the HTTP
    API) or with ``JOBS_ROLLUP_INTERVAL = 0``."""

    def __init__(
        self, duties: DatabaseDuties | None, gate: QueueGate, *, interval: float | None = None
    ) -> None:
        self.duties = duties
        self.gate = gate
        self.interval = conf.rollup_interval() if interval is None else interval
        self.enabled = duties is not None and self.interval > 0
        #: When the next look is due (time.monotonic()): soon after start, spread out so that
        #: workers started together do not look together.
        self.due_at = (
            time.monotonic() + random.uniform(0, min(self.interval, 5.0))
            if self.enabled
            else float("inf")
        )
        self.in_flight = False
        self.backoff = Backoff(FAILURE_RETRY_CAP)
        #: Hours this worker rolled up.
        self.passes = 0

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
        self.gate.send("rollups", lambda: duties.roll_up(WORKER_SPAN), self._done, own_backoff=True)

    def _done(self, rolled: Any) -> None:
        self.in_flight = False
        now = time.monotonic()
        if self.due_at == float("inf"):  # the worker began to stop meanwhile
            return
        if rolled is FAILED:
            # An outage waits for the queue's own backoff (its end is the database back); any
            # other error backs off the rollups alone.
            if self.gate.queue.broken:
                self.due_at = max(now + OUTAGE_RETRY, self.gate.retry_at)
            else:
                self.due_at = now + self.backoff.failed()
            return
        self.backoff.succeeded()
        if rolled is not None and rolled.advanced:
            self.passes += 1
            logger.info("rollups: rolled up an hour (%d hourly row(s))", rolled.rows)
            self.due_at = now + CATCH_UP_WAIT
        else:
            self.due_at = now + self.interval * random.uniform(0.8, 1.2)
