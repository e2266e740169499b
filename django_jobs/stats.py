"""Operations data for your own tools: what is queued, running, finishing and failing, per
queue; the numbers behind ``manage.py jobstats`` and the admin's dashboard, as plain lists and
dicts. They are read from the SQL views of docs/operations.md, through the store
(:mod:`django_jobs.store.operations_views`), on ``JOBS_READ_DATABASE``."""

from django_jobs.store.operations_views import (
    QueueSummary,
    Summary,
    WorkersSummary,
    format_age,
    queue_summary,
    recent_failures,
    render,
    running,
    stuck_jobs,
    summary,
    task_durations,
    throughput,
    to_json,
    workers,
)

__all__ = [
    "QueueSummary",
    "Summary",
    "WorkersSummary",
    "format_age",
    "queue_summary",
    "recent_failures",
    "render",
    "running",
    "stuck_jobs",
    "summary",
    "task_durations",
    "throughput",
    "to_json",
    "workers",
]
