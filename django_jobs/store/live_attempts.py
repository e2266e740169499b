"""What a running attempt reports before it ends: its progress and its captured log.

The statement is ``record_live`` in django_jobs/store/sql/progress.sql, fenced on the claim's lease.
"""

from __future__ import annotations

from typing import NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.progress import Progress
from django_jobs.store import db
from django_jobs.store.claiming import Lease
from django_jobs.store.sql import query


class Recorded(NamedTuple):
    """Which parts a live write matched: none, if the lease was lost."""

    progress: bool
    log: bool


def record_live(
    cursor: Cursor,
    lease: Lease,
    progress: Progress | None,
    log: str | None,
    *,
    whole_lease: bool = False,
) -> Recorded:
    """Write ``progress`` on the job and ``log`` on the attempt of ``lease`` (``None``: leave
    that part as it is). ``whole_lease``: match the lease's worker too, and write only while
    the attempt runs (what the HTTP API asks); else the last values of a worker of this app,
    queued before its finish, may land after it."""
    params = {
        "worker_id": lease.worker_id if whole_lease else None,
        "job_id": lease.job_id,
        "attempt": lease.attempt,
        "lease": lease.token,
        "done": None if progress is None else progress.done,
        "total": None if progress is None else progress.total,
        "message": "" if progress is None else progress.message,
        "log": log,
    }
    recorded = db.fetch_one_as(db.execute(cursor, query("record_live"), params), Recorded)
    assert recorded is not None  # a SELECT without FROM has one row
    return recorded
