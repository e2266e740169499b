"""The statements of the alerts (django_jobs/alerts.py): writing the thresholds of the
``django_jobs_alerts`` view into ``django_jobs_alert_threshold``, and reading the view. They are
in django_jobs/store/sql/alerts.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.operations_views import reading
from django_jobs.store.sql import query


class Synced(NamedTuple):
    """What a sync of the thresholds changed: rows written (new or changed), rows removed."""

    written: int
    removed: int


class Firing(NamedTuple):
    """The rows of ``django_jobs_alerts``, critical first, and the database's clock."""

    now: datetime
    alerts: list[dict[str, Any]]


def sync(cursor: Cursor, rows: Sequence[tuple[str, str, float]]) -> Synced:
    """Make ``django_jobs_alert_threshold`` hold exactly ``rows`` (kind, subject, value)."""
    params = {
        "kinds": [kind for kind, _, _ in rows],
        "subjects": [subject for _, subject, _ in rows],
        "values": [float(value) for _, _, value in rows],
    }
    result = db.fetch_one_as(db.execute(cursor, query("sync_alert_thresholds"), params), Synced)
    assert result is not None  # a SELECT without FROM has one row
    return result


def firing(using: str | None = None) -> Firing:
    """The rows of ``django_jobs_alerts``, critical first, read on ``JOBS_READ_DATABASE`` (or
    ``using``), in one transaction with the worker timeout of ``JOBS_WORKER_TIMEOUT``."""
    with reading(using) as cursor:
        result = db.execute(cursor, query("alerts"))
        names = [column[0] for column in result.description]
        rows = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
        now = db.execute(cursor, query("summary_clock")).fetchone()[0]
    return Firing(now, rows)
