"""What a running attempt reports before it ends: its progress, its cursors and its captured log.

The statement is ``record_live`` in django_jobs/store/sql/progress.sql, fenced on the claim's lease.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.progress import Progress
from django_jobs.store import db
from django_jobs.store.claiming import Lease
from django_jobs.store.sql import query


class Recorded(NamedTuple):
    """Which parts a live write matched: none, if the lease was lost. ``progress`` is the job
    row's part: the progress and the cursors."""

    progress: bool
    log: bool


def cursors_json(cursors: Mapping[str, str]) -> str:
    """Cursors (name -> the value's JSON text) as one JSON object's text."""
    return "{" + ",".join(f"{json.dumps(name)}:{value}" for name, value in cursors.items()) + "}"


def record_live(
    cursor: Cursor,
    lease: Lease,
    progress: Progress | None,
    log: str | None,
    *,
    cursors: Mapping[str, str] | None = None,
    whole_lease: bool = False,
) -> Recorded:
    """Write ``progress`` and ``cursors`` (name -> the value's JSON text) on the job and
    ``log`` on the attempt of ``lease`` (``None``, or no cursors: leave that part as it is).
    ``whole_lease``: match the lease's worker too, and write only while the attempt runs (what
    the HTTP API asks); else the last values of a worker of this app, queued before its finish,
    may land after it."""
    params = {
        "worker_id": lease.worker_id if whole_lease else None,
        "job_id": lease.job_id,
        "attempt": lease.attempt,
        "lease": lease.token,
        "done": None if progress is None else progress.done,
        "total": None if progress is None else progress.total,
        "message": "" if progress is None else progress.message,
        "log": log,
        "cursors": cursors_json(cursors) if cursors else None,
    }
    recorded = db.fetch_one_as(db.execute(cursor, query("record_live"), params), Recorded)
    assert recorded is not None  # a SELECT without FROM has one row
    return recorded
