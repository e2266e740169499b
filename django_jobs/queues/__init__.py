"""Queue controls: pausing and resuming queues, limits on a queue's or a key's running jobs,
rate limits on their starts, and fair queues.

- :mod:`~django_jobs.queues.controls`: pause, resume, limits and their checks (the public
  ``django_jobs.queues.pause(name, by=..., reason=...)`` and friends, re-exported here);
- :mod:`~django_jobs.queues.admin`: the admin of queue controls.

The table is :class:`django_jobs.models.Queue`; the claim function applies the controls.
"""

from django_jobs.queues.controls import (
    QueueState,
    UnknownQueue,
    check_fair,
    check_limit,
    check_limits,
    check_rates,
    known,
    pause,
    resume,
    set_limit,
    set_rate,
    states,
    sync_limits,
)

__all__ = [
    "QueueState",
    "UnknownQueue",
    "check_fair",
    "check_limit",
    "check_limits",
    "check_rates",
    "known",
    "pause",
    "resume",
    "set_limit",
    "set_rate",
    "states",
    "sync_limits",
]
