"""How a claim ends: finished by its worker, reaped, released, or handed back.

The statements are in django_jobs/store/sql/ending.sql; the worker's finish runs inside the
``django_jobs_finish()`` function (django_jobs/store/sql/functions/) through ``call_finish``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.states import TERMINAL_STATES, Outcome, State
from django_jobs.store import db
from django_jobs.store.claiming import (
    ClaimedJob,
    Lease,
    claim_params,
    claimed_job,
    lease_params,
)
from django_jobs.store.sql import query

#: The PL/pgSQL function the worker finishes with (django_jobs/store/sql/functions/).
FINISH_FUNCTION = "django_jobs_finish"


@dataclasses.dataclass(frozen=True)
class Ended:
    """Where an ended attempt left its job."""

    job_id: int
    state: str
    parent_id: int | None
    has_dependents: bool
    #: Unfinished children that the ended attempt spawned.
    has_children: bool = False

    @property
    def needs_settling(self) -> bool:
        """Whether workflows.settle() has work: a parent to finalize, dependents to promote or
        cancel, this job's own children to wait for, or those of a failed attempt to cancel."""
        if self.state == State.WAITING:
            return True
        if self.has_children:
            return True
        return self.state in TERMINAL_STATES and (self.parent_id is not None or self.has_dependents)


class FinishRow(NamedTuple):
    """A row of ``django_jobs_finish`` (and of the reap, which ends an attempt through it), its
    columns in the order of the function's ``RETURNS TABLE`` (tests/unit/test_sql.py checks the
    two agree); it also arrives from :func:`~django_jobs.store.db.execute_together`, without
    column names."""

    state: str
    parent_id: int | None
    has_dependents: bool
    has_children: bool


def _ended(job_id: int, row: Sequence[Any] | None) -> Ended | None:
    if row is None:
        return None
    ended = FinishRow._make(row)
    return Ended(
        job_id,
        State(ended.state).value,
        ended.parent_id,
        bool(ended.has_dependents),
        bool(ended.has_children),
    )


_ENDING_OUTCOMES = frozenset(Outcome.values) - {Outcome.RUNNING, Outcome.RELEASED}
_FINISH_DEFAULTS: dict[str, Any] = {
    "result_json": None,
    "error": "",
    "traceback": "",
    "retryable": True,
    "retry_delay": 0.0,
}


def _end_params(lease: Lease, outcome: str, **options: Any) -> dict[str, Any]:
    """The parameters of the end of an attempt (``call_finish``, ``reap``); ``options`` are
    :func:`finish`'s keyword arguments, which default as there."""
    ending = {**_FINISH_DEFAULTS, **options}
    result_json, error, traceback, retryable, retry_delay = (
        ending.pop(name) for name in tuple(_FINISH_DEFAULTS)
    )
    if ending:
        raise TypeError(f"unknown options of the end of an attempt: {', '.join(ending)}")
    if outcome not in _ENDING_OUTCOMES:
        raise ValueError(f"an attempt cannot end as {outcome!r}")
    return {
        **lease_params(lease),
        "outcome": outcome,
        "result": result_json if outcome == Outcome.DONE else None,
        "error": error,
        "traceback": traceback,
        "retryable": retryable,
        "retry_delay": max(0.0, float(retry_delay)),
    }


def finish(
    cursor: Cursor,
    lease: Lease,
    outcome: str,
    *,
    result_json: str | None = None,
    error: str = "",
    traceback: str = "",
    retryable: bool = True,
    retry_delay: float = 0.0,
) -> Ended | None:
    """End the attempt of ``lease`` with ``outcome``; say where the job went.

    Returns ``None`` if the lease was lost (the job was reaped, cancelled or re-claimed), or if
    this very write had already committed (see :func:`attempt_outcome`).
    """
    params = _end_params(
        lease,
        outcome,
        result_json=result_json,
        error=error,
        traceback=traceback,
        retryable=retryable,
        retry_delay=retry_delay,
    )
    return _ended(lease.job_id, db.execute(cursor, query("call_finish"), params).fetchone())


def finish_and_claim(
    cursor: Cursor,
    lease: Lease,
    outcome: str,
    queues: Sequence[str] | None,
    skip_tasks: Sequence[str] = (),
    **finish_options: Any,
) -> tuple[Ended | None, ClaimedJob | None]:
    """:func:`finish`, then claim the next job for the same worker, as one transaction in one
    round trip: a busy worker pays one commit per job instead of two. ``finish_options`` are
    :func:`finish`'s keyword arguments."""
    finished, claimed = db.execute_together(
        cursor,
        [
            (query("call_finish"), _end_params(lease, outcome, **finish_options)),
            (query("call_claim"), claim_params(lease.worker_id, queues, skip_tasks)),
        ],
    )
    return (
        _ended(lease.job_id, finished[0] if finished else None),
        claimed_job(lease.worker_id, claimed[0] if claimed else None),
    )


def finish_then_claim(
    cursor: Cursor,
    lease: Lease,
    outcome: str,
    queues: Sequence[str] | None,
    skip_tasks: Sequence[str] = (),
    *,
    first: Sequence[tuple[str, Any]] = (),
    **finish_options: Any,
) -> tuple[Ended | None, ClaimedJob | None]:
    """:func:`finish`, then, only if it matched the lease, claim the next job for the same worker:
    one statement (``call_finish_then_claim``), so one transaction in one round trip. Unlike
    :func:`finish_and_claim`, a lost lease claims nothing (the HTTP API answers it with a 409,
    which carries no job). The job claimed comes with its checkpoint, as
    :func:`~django_jobs.store.claim` reads it ``with_checkpoint``; ``first`` is as it takes it."""
    params = {
        **_end_params(lease, outcome, **finish_options),
        **claim_params(lease.worker_id, queues, skip_tasks),
    }
    statement = (query("call_finish_then_claim"), params)
    if first:
        *_, rows = db.execute_together(cursor, [*first, statement])
        row = rows[0] if rows else None
    else:
        row = db.execute(cursor, *statement).fetchone()
    if row is None:
        return None, None
    width = len(FinishRow._fields)
    claimed = None if row[width] is None else row[width:]
    job = claimed_job(lease.worker_id, claimed, with_checkpoint=True)
    return _ended(lease.job_id, row[:width]), job


def reap(
    cursor: Cursor,
    lease: Lease,
    outcome: str,
    *,
    error: str,
    retry_delay: float,
    silence: float | None,
    timeout_grace: float,
) -> Ended | None:
    """End a lost or overdue attempt as ``outcome`` (``lost`` or ``timeout``).

    The job must still be running under ``lease``, and either overdue or its worker silent (no
    heartbeat) for ``silence`` seconds; ``silence=None`` skips that check, for a worker known to
    be gone (an earlier boot of the worker that is starting). Returns the job's new state, or
    ``None`` if the job no longer qualifies.
    """
    params = _end_params(lease, outcome, error=error, retry_delay=retry_delay)
    params.update(silence=silence, timeout_grace=timeout_grace)
    return _ended(lease.job_id, db.execute(cursor, query("reap"), params).fetchone())


def release(cursor: Cursor, lease: Lease, reason: str = "released at worker shutdown") -> bool:
    """Put a running job back to pending without using up an attempt. False if lease lost."""
    params = {**lease_params(lease), "reason": reason}
    return db.execute(cursor, query("release"), params).fetchone() is not None


HANDED_BACK = "handed back"
EXPIRED = "expired"


@dataclasses.dataclass(frozen=True)
class HandBack:
    """What became of a job handed back: ``HANDED_BACK``, or ``EXPIRED`` (end it in error
    instead); and since when workers have been found without its task."""

    verdict: str | None
    missing_since: datetime.datetime


def hand_back(
    cursor: Cursor,
    lease: Lease,
    task: str,
    *,
    give_up_after: float,
    worker_timeout: float,
    seen_since: datetime.datetime | None = None,
) -> HandBack | None:
    """Hand back a job whose task this worker has not registered (see ``hand_back`` in
    ending.sql); ``None`` if the lease was lost."""
    params = {
        **lease_params(lease),
        "task": task,
        "give_up_after": give_up_after,
        "worker_timeout": worker_timeout,
        "seen_since": seen_since,
        "reason": f"waiting for a worker that has registered task {task!r}: "
        f"worker {lease.worker_id} has not",
    }
    return db.fetch_one_as(db.execute(cursor, query("hand_back"), params), HandBack)


def attempt_outcome(cursor: Cursor, lease: Lease) -> str | None:
    """The outcome recorded for ``lease``'s attempt (``running`` while it runs), or ``None`` if
    no attempt row carries that lease."""
    row = db.execute(cursor, query("attempt_outcome"), lease_params(lease)).fetchone()
    return None if row is None else str(row[0])
