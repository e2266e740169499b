"""What happened to each job, as the worker's log says it, and counted in its stats.

The supervisor decides and writes; this module only says what came of it. One line per event,
each with the structured fields of :mod:`django_jobs.logs` (``event``, ``job_id``, ``task``,
``attempt``, ``duration``, ``outcome``, ``state``), so that log shippers can follow a job.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django_jobs.store import ClaimedJob, Lease

logger = logging.getLogger("django_jobs.worker")


@dataclasses.dataclass
class WorkerStats:
    claimed: int = 0
    done: int = 0
    failed: int = 0
    lost_leases: int = 0


def job_fields(job: ClaimedJob, worker_id: str) -> dict[str, Any]:
    """The structured fields of a log line about ``job`` (a new dict: the caller may add to it)."""
    lease = job.lease
    return {
        "job_id": lease.job_id,
        "task": job.task,
        "queue": job.queue,
        "attempt": lease.attempt,
        "worker_id": worker_id,
    }


class OutcomeLog:
    """The log lines of one worker's jobs, and its counts of them in :attr:`stats`."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.stats = WorkerStats()

    def fields(self, job: ClaimedJob) -> dict[str, Any]:
        return job_fields(job, self.worker_id)

    def claimed(self, job: ClaimedJob) -> None:
        # Per job: nothing at all is built when nobody reads INFO (``--log-level WARNING``).
        if not logger.isEnabledFor(logging.INFO):
            return
        fields = self.fields(job)
        fields["event"] = "claim"
        logger.info(
            "job %d claimed: task=%s queue=%s attempt=%d/%d",
            fields["job_id"],
            job.task,
            job.queue,
            fields["attempt"],
            job.max_attempts,
            extra=fields,
        )

    def finished(
        self, job: ClaimedJob, outcome: str, options: dict[str, Any], state: str, elapsed: float
    ) -> None:
        """An attempt's end has committed, and left its job in ``state``."""
        if state == "done" or state == "waiting":
            self.stats.done += 1
            # The per-job line: built only if INFO is read (see :meth:`claimed`).
            if not logger.isEnabledFor(logging.INFO):
                return
        else:
            self.stats.failed += 1
        fields = self.fields(job)
        fields["duration"] = round(elapsed, 3)
        fields["outcome"] = outcome
        fields["event"] = "retry" if state == "pending" else "finish"
        fields["state"] = state
        if state == "done":
            logger.info("job %d done in %.3fs", job.id, elapsed, extra=fields)
        elif state == "waiting":
            logger.info(
                "job %d returned in %.3fs; waiting for its children", job.id, elapsed, extra=fields
            )
        elif state == "pending":
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
            logger.warning(
                "job %d ended %s after %d attempt(s) (%s): %s",
                job.id,
                state,
                job.attempt,
                outcome,
                options["error"],
                extra=fields,
            )

    def already_recorded(self, job: ClaimedJob, outcome: str) -> None:
        """A finish tried again found its outcome there: an earlier try committed, and only its
        reply was lost."""
        logger.info(
            "job %d: outcome %s was already recorded",
            job.id,
            outcome,
            extra={**self.fields(job), "event": "finish"},
        )

    def lease_lost(self, job: ClaimedJob, what: str, elapsed: float | None = None) -> None:
        self.stats.lost_leases += 1
        fields: dict[str, Any] = {**self.fields(job), "event": "lease_lost"}
        if elapsed is not None:
            fields["duration"] = round(elapsed, 3)
        logger.warning(
            "job %d lease lost (attempt %d): %s; another run owns the job now",
            job.id,
            job.attempt,
            what,
            extra=fields,
        )

    def released(self, lease: Lease, fields: dict[str, Any]) -> None:
        logger.info(
            "job %d released for another worker",
            lease.job_id,
            extra={**fields, "event": "release"},
        )

    def not_released(self, lease: Lease, fields: dict[str, Any]) -> None:
        self.stats.lost_leases += 1
        logger.warning(
            "job %d lease lost (attempt %d): could not be released",
            lease.job_id,
            lease.attempt,
            extra={**fields, "event": "lease_lost"},
        )

    def stopped(self) -> None:
        logger.info(
            "worker %s stopped: %d claimed, %d done, %d failed, %d leases lost",
            self.worker_id,
            self.stats.claimed,
            self.stats.done,
            self.stats.failed,
            self.stats.lost_leases,
            extra={"worker_id": self.worker_id},
        )
