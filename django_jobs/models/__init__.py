"""The tables of django-jobs, one module per table or feature: jobs
(:mod:`~django_jobs.models.job`), their attempts (:mod:`~django_jobs.models.attempt`) and
dependencies (:mod:`~django_jobs.models.dependency`), steps (:mod:`~django_jobs.models.step`),
live workers (:mod:`~django_jobs.models.live_worker`), periodic jobs
(:mod:`~django_jobs.models.schedule`), queue controls and rate windows
(:mod:`~django_jobs.models.queue_control`),
API tokens (:mod:`~django_jobs.models.api_token`), the thresholds of the alerts view
(:mod:`~django_jobs.models.alert_threshold`) and the hourly rollups
(:mod:`~django_jobs.models.rollup`). Tables and constraints only: what changes
rows lives in :mod:`django_jobs.store` and the feature folders."""

from django_jobs.models.alert_threshold import AlertThreshold
from django_jobs.models.api_token import ApiToken
from django_jobs.models.attempt import Attempt
from django_jobs.models.dependency import Dependency
from django_jobs.models.job import Dashboard, Job, TransactionNow
from django_jobs.models.live_worker import Worker
from django_jobs.models.queue_control import Queue, RateWindow
from django_jobs.models.rollup import Rollup, RollupState, RollupTotal
from django_jobs.models.schedule import Schedule, ScheduleTick
from django_jobs.models.step import Step

# The states and outcomes the tables hold, importable from here as they always were.
from django_jobs.states import (  # noqa: F401
    ACTIVE_STATES,
    FAILED_OUTCOMES,
    TERMINAL_STATES,
    Outcome,
    State,
)

__all__ = [
    "AlertThreshold",
    "ApiToken",
    "Attempt",
    "Dashboard",
    "Dependency",
    "Job",
    "Queue",
    "RateWindow",
    "Rollup",
    "RollupState",
    "RollupTotal",
    "Schedule",
    "ScheduleTick",
    "Step",
    "TransactionNow",
    "Worker",
]
