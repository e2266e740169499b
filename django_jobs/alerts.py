"""Alerts for what did not happen: the ``django_jobs_alerts`` view, its thresholds, and what
``manage.py jobsalerts`` prints.

The view (migration 0022, documented in docs/operations.md) has one row per firing condition:
a schedule that has not succeeded within its window, a job running past its expected duration,
a queue whose oldest ready job waits too long, a queue with ready jobs and no live worker, and
a task whose jobs use up their attempts. It is plain SQL, so Grafana and psql read it with no
Python; the thresholds it needs, which live in Python (``JOBS_ALERTS``, and each task's
``@job(expected_duration=...)``), are written into the table ``django_jobs_alert_threshold`` by
:func:`sync_thresholds`: when a worker or a scheduler starts, by ``syncschedules``, and by every
``jobsalerts`` run. Without a row, the view uses ``JOBS_ALERTS``' defaults.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_jobs import conf
from django_jobs.cursor import Cursor
from django_jobs.registry import registry
from django_jobs.store import alerts as store
from django_jobs.store.operations_views import format_age

logger = logging.getLogger("django_jobs.alerts")

#: The kinds of alert, in the order ``jobsalerts`` prints them (critical ones first).
KINDS = (
    "schedule_missed",
    "job_overdue",
    "queue_age",
    "queue_no_worker",
    "attempts_exhausted",
)
SEVERITIES = ("warning", "critical")

#: A threshold row: (kind, subject, value). The subject is a schedule, queue or task name, or
#: :data:`~django_jobs.conf.ALERT_DEFAULT_SUBJECT` for every other one (and for the
#: thresholds that have no subject).
Threshold = tuple[str, str, float]


def thresholds(settings: conf.Alerts | None = None) -> list[Threshold]:
    """The rows of ``django_jobs_alert_threshold`` that ``JOBS_ALERTS`` and the registered
    tasks make. Raises ``ImproperlyConfigured`` for a bad setting."""
    settings = conf.alerts() if settings is None else settings
    every = conf.ALERT_DEFAULT_SUBJECT
    rows: list[Threshold] = []
    for kind, per_subject in (
        ("schedule_grace", settings.schedule_grace),
        ("queue_age", settings.queue_age),
        ("no_worker", settings.no_worker),
    ):
        rows += [(kind, subject, value) for subject, value in sorted(per_subject.items())]
    expected = {
        task.name: float(task.expected_duration)
        for task in registry.all()
        if task.expected_duration is not None
    }
    expected.update(settings.expected_duration)
    rows += [("expected_duration", task, value) for task, value in sorted(expected.items())]
    rows += [
        ("overdue_p95_factor", every, settings.p95_factor),
        ("overdue_min_seconds", every, settings.overdue_min_seconds),
        ("exhausted_threshold", every, settings.exhausted_threshold),
        ("exhausted_window", every, settings.exhausted_window),
    ]
    return rows


def unknown_tasks(settings: conf.Alerts | None = None) -> list[str]:
    """The task names of ``JOBS_ALERTS['expected_duration']`` that no ``@job``,
    ``remote_job()`` or ``JOBS_REMOTE_TASKS`` registers: a typo, whose threshold would never
    apply."""
    settings = conf.alerts() if settings is None else settings
    return sorted(task for task in settings.expected_duration if task not in registry)


def sync_thresholds(cursor: Cursor | None = None) -> store.Synced | None:
    """Write :func:`thresholds` into ``django_jobs_alert_threshold``, in one statement: rows
    this process no longer makes are deleted, unchanged ones are not written. An invalid
    ``JOBS_ALERTS`` (``manage.py check`` reports it) is logged and nothing is written (None)."""
    try:
        rows = thresholds()
    except ImproperlyConfigured as error:
        logger.error("alert thresholds not synced: %s", error)
        return None
    if cursor is None:
        with connections[conf.database_alias()].cursor() as own:
            return store.sync(own, rows)
    return store.sync(cursor, rows)


def firing(using: str | None = None, severity: str = "warning") -> store.Firing:
    """The rows of ``django_jobs_alerts`` of ``severity`` or worse, critical first, with the
    database's clock; read on ``JOBS_READ_DATABASE`` (or ``using``)."""
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, not {severity!r}")
    found = store.firing(using)
    wanted = SEVERITIES[SEVERITIES.index(severity) :]
    return found._replace(alerts=[row for row in found.alerts if row["severity"] in wanted])


def render(found: store.Firing) -> str:
    """The alerts as text: per alert, a line with its severity, kind, subject and since when,
    and an indented line that says what is wrong."""
    lines = []
    for row in found.alerts:
        since = row["since"]
        when = ""
        if since is not None:
            lasting = format_age(max(0.0, (found.now - since).total_seconds()))
            when = f"  since {since:%Y-%m-%d %H:%M:%S %Z} ({lasting})"
        lines += [
            f"{row['severity'].upper():<8} {row['kind']:<18} {row['subject']}{when}",
            f"         {row['detail']}",
        ]
    return "\n".join(lines) if lines else "no alerts firing"


def to_json(found: store.Firing) -> str:
    """The alerts as one JSON object: ``{"generated_at": ..., "alerts": [...]}``, times in
    ISO 8601."""
    return json.dumps(
        {"generated_at": found.now, "alerts": found.alerts},
        default=lambda value: value.isoformat() if isinstance(value, datetime) else str(value),
    )
