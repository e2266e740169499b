"""Operators' actions over batches of ids: cancel, retry, run now; and how a change over a batch
comes back for the ids another transaction held.

The statements are in django_jobs/store/sql/control.sql. The cancellation cascade to children and
dependents is workflows.cancel_with_cascade.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.sql import query
from django_jobs.store.steps import clear_checkpoint


@dataclasses.dataclass(frozen=True)
class Cancelled:
    job_id: int
    state: str  # "cancelled", or "running" when cancellation was requested
    linked: bool  # has children or dependents, which the cancellation cascades to


@dataclasses.dataclass
class Changes:
    """What a statement over a batch of ids did: the ids it changed, and those it skipped
    because another transaction held them (to try again)."""

    changed: list[Any] = dataclasses.field(default_factory=list)
    busy: list[int] = dataclasses.field(default_factory=list)


class _Change(NamedTuple):
    id: int
    #: What the statement did to the job, or ``busy``.
    what: str


def changes_of(result: Cursor) -> Changes:
    """:class:`Changes` from the rows of a batch statement, ``(id, what)``, ``what`` being
    ``busy`` for the ids another transaction held."""
    changes = Changes()
    for row in db.fetch_all_as(result, _Change):
        (changes.busy if row.what == "busy" else changes.changed).append(row.id)
    return changes


#: How often a change over a batch of ids comes back for the ids that another transaction held
#: (it skipped them: SKIP LOCKED), and how long it waits before the first such try; each try
#: waits longer. What is still held then is reported as busy.
BUSY_RETRIES = 5
BUSY_PAUSE = 0.05


def until_free(change: Callable[[list[int]], Changes], ids: Sequence[int]) -> Changes:
    """Run ``change`` over ``ids``, then again over the ids it found busy, a few times."""
    result = change(list(ids))
    for attempt in range(1, BUSY_RETRIES + 1):
        if not result.busy:
            break
        time.sleep(BUSY_PAUSE * attempt)
        again = change(result.busy)
        result = Changes(result.changed + again.changed, again.busy)
    return result


class _CancelRow(NamedTuple):
    id: int
    state: str
    linked: bool


def cancel_without_cascade(
    cursor: Cursor, ids: Sequence[int], reason: str = "cancelled"
) -> Changes:
    """Cancel these jobs and nothing else: a pending or waiting job ends at once, a running one
    is asked to stop (workflows.cancel_with_cascade does the rest). ``changed`` has a
    :class:`Cancelled` per job changed. Finished jobs are skipped."""
    params = {"ids": list(ids), "reason": reason}
    result = Changes()
    for row in db.fetch_all_as(db.execute(cursor, query("cancel_many"), params), _CancelRow):
        if row.state == "busy":
            result.busy.append(row.id)
        else:
            result.changed.append(Cancelled(row.id, row.state, row.linked))
    return result


#: How many jobs past their deadline one expiry statement ends, at most.
EXPIRE_BATCH = 100


def expire_due(cursor: Cursor, limit: int = EXPIRE_BATCH) -> Changes:
    """End pending jobs whose deadline has passed (``expire_due``): ``changed`` has a
    :class:`Cancelled` per job ended, for the cascade (workflows.expire_due)."""
    result = Changes()
    rows = db.fetch_all_as(db.execute(cursor, query("expire_due"), {"limit": limit}), _CancelRow)
    for row in rows:
        result.changed.append(Cancelled(row.id, row.state, row.linked))
    return result


# Retry and run-now are operators' actions (the admin, Job.retry(), Job.run_now()); the
# single-job functions use the set-based forms.


def retry(cursor: Cursor, job_id: int, budget: int, *, from_start: bool = False) -> bool:
    """Requeue a job that ended in error or was cancelled, ready now, with ``budget`` more
    attempts; it resumes from its recorded steps and cursors, or, ``from_start``, forgets them.
    False if its state does not allow it, a dependency is not done, or another active job holds
    its unique key."""
    result = until_free(
        lambda ids: retry_many(cursor, {i: budget for i in ids}, from_start=from_start), [job_id]
    )
    return result.changed == [job_id]


def run_now(cursor: Cursor, job_id: int) -> bool:
    """Make a pending job ready now. False if it is not pending."""
    return until_free(lambda ids: run_now_many(cursor, ids), [job_id]).changed == [job_id]


def retry_many(cursor: Cursor, budgets: dict[int, int], *, from_start: bool = False) -> Changes:
    """:func:`retry` for many jobs (id -> attempt budget); ``changed`` has the ids requeued.
    ``from_start``: their steps and cursors are forgotten, in the retry's transaction."""
    params = {"ids": list(budgets), "budgets": list(budgets.values())}
    if not from_start:
        return changes_of(db.execute(cursor, query("retry_many"), params))
    with db.transaction(cursor):
        changes = changes_of(db.execute(cursor, query("retry_many"), params))
        clear_checkpoint(cursor, changes.changed)
    return changes


def run_now_many(cursor: Cursor, ids: Sequence[int]) -> Changes:
    """:func:`run_now` for many jobs; ``changed`` has the ids made ready."""
    return changes_of(db.execute(cursor, query("run_now_many"), {"ids": list(ids)}))


class _KeyHolder(NamedTuple):
    job_id: int
    unique_key: str
    holder_id: int
    holder_state: str


def unique_key_holders(cursor: Cursor, ids: Sequence[int]) -> dict[int, tuple[str, int, str]]:
    """For each of ``ids`` whose unique key an active job holds: (key, holder id, its state)."""
    result = db.execute(cursor, query("unique_key_holders"), {"ids": list(ids)})
    return {
        row.job_id: (row.unique_key, row.holder_id, row.holder_state)
        for row in db.fetch_all_as(result, _KeyHolder)
    }
