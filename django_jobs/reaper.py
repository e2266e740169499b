"""The reaper: recover running jobs whose worker is gone, or that ran far past their timeout.

Each job is handled in its own short statement with SKIP LOCKED, and the reason is re-checked
inside it (see :func:`django_jobs.store.reap`), so the reaper never touches a job that
finished, was re-claimed, or whose worker turned out to be alive. A reaped attempt ends ``lost``
(or ``timeout``); the job is retried while attempts remain, and ends ``error`` otherwise.

:func:`reap_pass` is one pass; :func:`reap_loop` runs passes until told to stop, and outlasts a
database restart or failover. A worker recovers for itself what it alone can tell is lost:
the jobs of its own earlier boot (:func:`recover_earlier_boots`), and its orphans
(:func:`recover_orphans`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from django_jobs import conf, store, workflows
from django_jobs.cursor import Cursor
from django_jobs.liveness import LivenessCheck, liveness_check
from django_jobs.registry import registry
from django_jobs.runtime.identity import name_of
from django_jobs.states import Outcome
from django_jobs.store import Lease, RunningJob, WorkerInfo, db, diagnosis
from django_jobs.store.connection import is_connection_fatal

logger = logging.getLogger("django_jobs.reaper")
# The recovery a worker makes for itself is logged as the worker's.
worker_logger = logging.getLogger("django_jobs.worker")


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
    #: Pending jobs ended as expired: their deadline had passed before they started.
    expired: list[int] = dataclasses.field(default_factory=list)

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
            + (f"; {len(self.expired)} expired" if self.expired else "")
        )


def _retry_delay(job: RunningJob) -> float:
    return registry.backoff_for(job.task, job.lease.attempt)


def end_attempts(
    cursor: Cursor,
    candidates: list[tuple[RunningJob, str, str, float | None]],
    *,
    dry_run: bool = False,
    emit: Callable[[str], None] | None = None,
) -> list[ReapAction]:
    """Reap each ``(job, outcome, reason, silence)`` in its own statement; report each: to
    ``emit`` if given (a command's output), else to the log."""
    actions = []
    grace = conf.timeout_grace()
    for job, outcome, reason, silence in candidates:
        delay = _retry_delay(job)
        state = None
        if not dry_run:
            try:
                ended = store.reap(
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
        if emit:
            emit(line)
            continue
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
    return actions


def reap_pass(
    *,
    dry_run: bool = False,
    liveness: LivenessCheck | None = None,
    emit: Callable[[str], None] | None = None,
) -> ReapReport:
    """One pass of the reaper over every running job. Each job's line goes to ``emit`` if
    given, else to the log."""
    liveness = liveness or liveness_check()
    grace = conf.timeout_grace()
    report = ReapReport(dry_run=dry_run)
    with connections[conf.database_alias()].cursor() as cursor:
        if not dry_run:
            report.expired = _expire_all(cursor)
            for job_id in report.expired:
                line = f"job {job_id} expired: it had not started by its deadline"
                if emit:
                    emit(line)
                else:
                    logger.warning(line, extra={"job_id": job_id})
            report.repaired = workflows.repair(cursor)
            for job_id in report.repaired:
                line = f"settled job {job_id}: it was waiting with nothing left to wait for"
                if emit:
                    emit(line)
                else:
                    logger.warning(line, extra={"job_id": job_id})
        running = store.running_jobs(cursor, grace)
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
                store.delete_worker_if_idle(cursor, worker_id, verdict.silence)
    return report


def _expire_all(cursor: Cursor, batches: int = 100) -> list[int]:
    """End the jobs past their deadline, a batch at a time (at most ``batches`` of them)."""
    ended: list[int] = []
    for _ in range(batches):
        batch = workflows.expire_due(cursor)
        ended += batch
        if len(batch) < store.EXPIRE_BATCH:
            break
    return ended


#: The longest wait between two passes while the database stays unreachable (unless the
#: interval is longer).
MAX_RETRY_DELAY = 60.0


def reap_loop(
    interval: float,
    stop: threading.Event,
    *,
    dry_run: bool = False,
    emit: Callable[[str], None] | None = None,
    on_pass: Callable[[ReapReport], None] | None = None,
) -> None:
    """Run :func:`reap_pass` every ``interval`` seconds until ``stop`` is set; hand each
    pass's report to ``on_pass``.

    A pass that fails because the database went away or refused for now (a restart, a failover,
    a wait running out) logs one warning and closes the connection; the next pass comes after
    the interval, doubling while the failures go on, up to :data:`MAX_RETRY_DELAY`. Any other
    error ends the loop: trying again cannot mend it.
    """
    failures = 0
    while True:
        try:
            report = reap_pass(dry_run=dry_run, emit=emit)
        except DatabaseError as exc:
            if not database_unavailable(exc):
                raise
            failures += 1
            delay = min(interval * 2 ** min(failures - 1, 16), max(interval, MAX_RETRY_DELAY))
            # The next pass reconnects; a broken connection would fail it again.
            with contextlib.suppress(DatabaseError):
                connections[conf.database_alias()].close()
            logger.warning(
                "reaper pass failed (%s); trying again in %.1fs",
                diagnosis.describe(exc, conf.database_alias()),
                delay,
            )
        else:
            if failures:
                logger.info("database reachable again after %d failed pass(es)", failures)
            failures = 0
            delay = interval
            if on_pass:
                on_pass(report)
        if stop.wait(delay):
            return


def database_unavailable(exc: DatabaseError) -> bool:
    """Whether ``exc`` says that the database cannot serve the reaper for now (its connection
    broke, it is shutting down or read-only, a bounded wait ran out), rather than a fault that
    trying again cannot mend."""
    # Django wraps the driver's error; a read-only server (25006) is not an OperationalError.
    return isinstance(exc, OperationalError | InterfaceError) or is_connection_fatal(
        exc.__cause__ or exc
    )


# ------------------------------------------------------------------ a worker's own recovery


def recover_earlier_boots(cursor: Cursor, worker: WorkerInfo) -> list[ReapAction]:
    """Recover jobs left running by an earlier boot of ``worker``'s name on its host (a
    container restarted in its pod keeps the pod name): that boot is certainly gone."""
    candidates: list[tuple[RunningJob, str, str, float | None]] = []
    for job in store.running_jobs(cursor, conf.timeout_grace()):
        earlier = job.lease.worker_id
        if earlier == worker.id or name_of(earlier) != worker.name:
            continue
        same_host = job.host == worker.host
        if job.unregistered or (same_host and (job.pid == worker.pid or not pid_alive(job.pid))):
            reason = f"worker restarted: earlier boot {earlier} is gone"
            candidates.append((job, Outcome.LOST, reason, None))
    return end_attempts(cursor, candidates)


def pid_alive(pid: int | None) -> bool:
    """Whether a process ``pid`` runs on this host (one that is not ours counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclasses.dataclass(frozen=True)
class Remembered:
    """A finish that has committed, kept until a later heartbeat proves it is still there."""

    token: str | None
    replay: Callable[[], None]


def recover_orphans(
    orphans: list[Lease],
    remembered: dict[int, Remembered],
    release: Callable[[Lease, dict[str, Any], str], None],
) -> None:
    """Deal with jobs running under a worker's id that it does not run (see
    store.heartbeat). Neither case is the job's fault, so neither costs an attempt:
    a finish the database lost is written again from memory (it is fenced on the lease, so
    writing it twice is safe); any other orphan is a claim whose reply never reached the
    worker, and is ``release``d."""
    for lease in orphans:
        fields = {
            "job_id": lease.job_id,
            "attempt": lease.attempt,
            "worker_id": lease.worker_id,
        }
        known = remembered.get(lease.job_id)
        if known is not None and known.token == lease.token:
            worker_logger.warning(
                "job %d: the database lost its recorded outcome (a crash or failover);"
                " writing it again",
                lease.job_id,
                extra={**fields, "event": "replay"},
            )
            known.replay()
        else:
            worker_logger.warning(
                "job %d is running under this worker in the database, but this worker never"
                " started it (the claim's reply was lost); releasing it without counting"
                " the attempt",
                lease.job_id,
                extra={**fields, "event": "orphan"},
            )
            release(lease, fields, "released: its worker never got the claim")
