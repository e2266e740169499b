"""The reaper: recover running jobs whose worker is gone, or that ran far past their timeout.

Each job is handled in its own short statement with SKIP LOCKED, and the reason is re-checked
inside it (see :func:`django_jobs.transitions.reap`), so the reaper never touches a job that
finished, was re-claimed, or whose worker turned out to be alive. A reaped attempt ends ``lost``
(or ``timeout``); the job is retried while attempts remain, and ends ``error`` otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from django_jobs import conf, db, transitions, workflows
from django_jobs.liveness import LivenessCheck, liveness_check
from django_jobs.registry import registry
from django_jobs.states import Outcome
from django_jobs.transitions import RunningJob

logger = logging.getLogger("django_jobs.reaper")


@dataclasses.dataclass(frozen=True)
class ReapAction:
    job: RunningJob
    outcome: str
    reason: str
    new_state: str | None  # None: skipped (it no longer qualified), or a dry run
    retry_delay: float

    def describe(self, dry_run: bool = False) -> str:
        lease = self.job.lease
        head = (
            f"job {lease.job_id} ({self.job.task}, attempt {lease.attempt}/{self.job.max_attempts},"
            f" worker {lease.worker_id}): {self.reason}"
        )
        if dry_run:
            return f"would reap {head}"
        if self.new_state is None:
            return f"skipped {head}: no longer qualifies (finished, re-claimed, or worker alive)"
        if self.new_state == "pending":
            return f"reaped {head} -> retry in {self.retry_delay:.0f}s"
        return f"reaped {head} -> {self.new_state}"


@dataclasses.dataclass
class ReapReport:
    actions: list[ReapAction] = dataclasses.field(default_factory=list)
    dry_run: bool = False
    repaired: list[int] = dataclasses.field(default_factory=list)

    def count(self, state: str | None) -> int:
        return sum(1 for a in self.actions if a.new_state == state)

    @property
    def reaped(self) -> int:
        return sum(1 for a in self.actions if a.new_state is not None)

    def summary(self) -> str:
        if self.dry_run:
            return f"dry run: {len(self.actions)} job(s) would be reaped"
        return (
            f"reaped {self.reaped} job(s): {self.count('pending')} retried, "
            f"{self.count('error')} failed, {self.count('cancelled')} cancelled; "
            f"{self.count(None)} skipped"
            + (f"; settled {len(self.repaired)} waiting job(s)" if self.repaired else "")
        )


def _retry_delay(job: RunningJob) -> float:
    return registry.backoff_for(job.task, job.lease.attempt)


def end_attempts(
    cursor: Any,
    candidates: list[tuple[RunningJob, str, str, float | None]],
    *,
    dry_run: bool = False,
    emit: Callable[[str], None] | None = None,
) -> list[ReapAction]:
    """Reap each ``(job, outcome, reason, silence)`` in its own statement; report each."""
    actions = []
    grace = conf.timeout_grace()
    for job, outcome, reason, silence in candidates:
        delay = _retry_delay(job)
        state = None
        if not dry_run:
            try:
                ended = transitions.reap(
                    cursor,
                    job.lease,
                    outcome,
                    error=f"{outcome}: {reason}",
                    retry_delay=delay,
                    silence=silence,
                    timeout_grace=grace,
                )
            except DatabaseError as exc:
                if not db.is_timeout(exc):
                    raise
                # A lock or statement wait ran out: leave this job for the next pass.
                logger.warning("job %d: %s; trying again next pass", job.lease.job_id, exc)
                ended = None
            if ended is not None:
                state = ended.state
                if ended.needs_settling:
                    workflows.settle(cursor, job.lease.job_id)
        action = ReapAction(job, outcome, reason, state, delay)
        actions.append(action)
        line = action.describe(dry_run)
        logger.warning(
            line,
            extra={
                "event": "reap",
                "job_id": job.lease.job_id,
                "task": job.task,
                "attempt": job.lease.attempt,
                "worker_id": job.lease.worker_id,
                "outcome": outcome,
                "state": state or "",
                "queue": job.queue,
                "duration": None if job.running_for is None else round(job.running_for, 3),
            },
        )
        if emit:
            emit(line)
    return actions


def reap(
    *,
    dry_run: bool = False,
    liveness: LivenessCheck | None = None,
    emit: Callable[[str], None] | None = None,
) -> ReapReport:
    """One pass of the reaper over every running job."""
    liveness = liveness or liveness_check()
    grace = conf.timeout_grace()
    report = ReapReport(dry_run=dry_run)
    with connections[conf.database_alias()].cursor() as cursor:
        if not dry_run:
            report.repaired = workflows.repair(cursor)
            for job_id in report.repaired:
                line = f"settled job {job_id}: it was waiting with nothing left to wait for"
                logger.warning(line, extra={"job_id": job_id})
                if emit:
                    emit(line)
        running = transitions.running_jobs(cursor, grace)
        if not running:
            return report
        verdicts = liveness.dead_workers(running, cursor)
        candidates: list[tuple[RunningJob, str, str, float | None]] = []
        for job in running:
            verdict = verdicts.get(job.lease.worker_id)
            if job.overdue:
                reason = f"running past its timeout of {job.timeout}s (plus {grace:.0f}s grace)"
                candidates.append((job, Outcome.TIMEOUT, reason, None))
            elif verdict is not None:
                reason = f"worker gone: {verdict.reason}"
                candidates.append((job, Outcome.LOST, reason, verdict.silence))
        report.actions = end_attempts(cursor, candidates, dry_run=dry_run, emit=emit)
        if not dry_run:
            for worker_id, verdict in sorted(verdicts.items()):
                transitions.delete_worker_if_idle(cursor, worker_id, verdict.silence)
    return report
