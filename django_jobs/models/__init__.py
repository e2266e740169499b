"""The tables of django-jobs, one module per feature: jobs, attempts, dependencies and workers
(:mod:`~django_jobs.models.job`), periodic jobs (:mod:`~django_jobs.models.schedule`), queue
controls (:mod:`~django_jobs.models.queue_control`) and API tokens
(:mod:`~django_jobs.models.api_token`). Tables and constraints only: what changes rows lives in
:mod:`django_jobs.store` and the feature folders."""

from django_jobs.models.api_token import ApiToken
from django_jobs.models.job import Attempt, Dashboard, Dependency, Job, TransactionNow, Worker
from django_jobs.models.queue_control import Queue
from django_jobs.models.schedule import Schedule, ScheduleTick

__all__ = [
    "ApiToken",
    "Attempt",
    "Dashboard",
    "Dependency",
    "Job",
    "Queue",
    "Schedule",
    "ScheduleTick",
    "TransactionNow",
    "Worker",
]
