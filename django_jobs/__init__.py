"""django-jobs: coarse-grained background jobs for Django, on PostgreSQL alone.

Define jobs with :func:`job`, enqueue them with ``task.enqueue(...)``, run them with
``manage.py runjobworker``, and schedule ``manage.py reapjobs``.
"""

from django_jobs.exceptions import (
    DependencyError,
    Fail,
    InvalidOption,
    InvalidPayload,
    JobsError,
    Retry,
    UnknownTask,
)
from django_jobs.tasks import Task, job, remote_job

__all__ = [
    "DependencyError",
    "Fail",
    "InvalidOption",
    "InvalidPayload",
    "JobsError",
    "Retry",
    "Task",
    "UnknownTask",
    "job",
    "remote_job",
]
