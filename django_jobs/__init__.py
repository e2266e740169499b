"""django-jobs: coarse-grained background jobs for Django, on PostgreSQL alone.

Define jobs with :func:`job`, enqueue them with ``task.enqueue(...)``, run them with
``manage.py runjobworker``, and schedule ``manage.py reapjobs``.
"""

from django_jobs.exceptions import (
    Cancelled,
    DependencyError,
    Fail,
    InvalidOption,
    InvalidPayload,
    InvalidStepResult,
    JobsError,
    LeaseLost,
    Retry,
    StepError,
    UnknownTask,
)
from django_jobs.tasks import Task, job, remote_job

__all__ = [
    "Cancelled",
    "DependencyError",
    "Fail",
    "InvalidOption",
    "InvalidPayload",
    "InvalidStepResult",
    "JobsError",
    "LeaseLost",
    "Retry",
    "StepError",
    "Task",
    "UnknownTask",
    "job",
    "remote_job",
]
