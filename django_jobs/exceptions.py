"""The exception hierarchy of django-jobs.

Errors raised to callers derive from :class:`JobsError`. :class:`Retry` and :class:`Fail` are
raised *by job functions* to steer the retry policy.
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from django.db.utils import OperationalError, ProgrammingError

#: How to see which tasks a process has registered (said where a task is missing).
REGISTERED_TASKS_HINT = "To list the registered tasks: python manage.py jobs tasks"


class JobsError(Exception):
    """Base class of every error django-jobs raises."""


class UnknownTask(JobsError, LookupError):
    """A task name is not in the registry of ``@job`` functions."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"unknown task {name!r}: no @job function is registered under that name in this "
            "process. Define it in an installed app's jobs.py (or tasks.py, for @task functions "
            "of Django's Tasks framework), or import its module at startup, and deploy it to the "
            "workers before enqueueing. "
            f"{REGISTERED_TASKS_HINT}"
        )


class JobTablesMissing(JobsError, ProgrammingError):
    """The job tables, or some of their columns or functions, are not in the database:
    ``manage.py migrate`` was not run, or not since an upgrade. The message says which
    migrations are missing when the database tells. A ``ProgrammingError``, as before."""


class DatabaseUnreachable(JobsError, OperationalError):
    """The jobs database is down or refused the connection (or, for the reads of the
    operations data, did not answer in time). The message names the alias and the host. An
    ``OperationalError``, as before."""


class InvalidPayload(JobsError, ValueError, TypeError):
    """Job arguments are not plain JSON, or are larger than ``JOBS_MAX_PAYLOAD_BYTES``.

    Both a ``ValueError`` and a ``TypeError``: Django's Tasks framework raises ``TypeError`` for
    an argument JSON cannot hold, and code written for it catches that."""


class InvalidOption(JobsError, ValueError):
    """A job option (priority, queue, timeout, ...) is out of range or of the wrong type."""


class DependencyError(JobsError, ValueError):
    """A dependency names a job that does not exist, or the job itself."""


class SpawnRefused(JobsError):
    """A job tried to spawn a child after its cancellation was requested, or after its run lost
    its lease (another run owns the job now). Nothing was created; the job should stop."""


class LeaseLost(JobsError):
    """This run of a job no longer owns it: the job was reaped, re-claimed or ended under another
    run (the worker's heartbeats stopped committing, say), or deleted. Raised in job code by a
    step or cursor save, which recorded nothing, and by ``context.raise_if_cancelled()``. The job
    should stop: whatever it writes now races the run that owns the job."""


class StepError(JobsError, ValueError):
    """A ``context.step()`` or ``context.save_cursor()`` that cannot be made as asked: a name
    that is empty, too long or used twice in one attempt, a step started inside another, or a
    step called inside ``transaction.atomic()``. Nothing was recorded."""


class InvalidStepResult(StepError):
    """A step's function returned a value that cannot be recorded (not plain JSON, or larger
    than ``JOBS_MAX_PAYLOAD_BYTES``), or a cursor's value is such a value. The step is not
    recorded; raised from a step, it fails the attempt for good, since running the step again
    would return the same."""


class ApiRefused(JobsError):
    """The jobs HTTP API refused a worker's request (400, 401, 403, 404...): a bad or revoked
    token, a queue the token does not hold, a wrong ``--api`` URL, a value it cannot store.
    Trying again will not help: the request is never sent again."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ApiUnreachable(JobsError, ConnectionError):
    """The jobs HTTP API did not answer (a network error, a timeout) or answered with a server
    error (5xx), or asked to be tried again later (408, 429): an outage, retried until it is
    over."""


class Retry(Exception):
    """Raise from a job to ask for another attempt, optionally after a given delay.

    The attempt still counts: if no attempts are left the job ends in ``error``.
    """

    def __init__(self, after: float | timedelta | None = None, reason: str = "") -> None:
        if isinstance(after, timedelta):
            after = after.total_seconds()
        self.after = after
        self.reason = reason
        super().__init__(reason or "retry requested")


class Fail(Exception):
    """Raise from a job to end it in ``error`` at once, without further retries."""

    #: The class an attempt's error names, when it is not this one's own.
    reported_as: ClassVar[type[BaseException] | None] = None


class Cancelled(Exception):
    """Raise from a job (or let ``context.raise_if_cancelled()`` raise it) to end it
    ``cancelled`` at once: its attempt's outcome is ``cancelled``, not ``error``, it is not
    retried, and its dependents are cancelled as for any cancelled job."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason or "cancelled")


class InvalidResult(Fail, TypeError):
    """A task of Django's Tasks framework returned a value that is not JSON: the attempt fails
    for good, recorded as a ``TypeError``, as the framework's own backends record it."""

    reported_as = TypeError


class AttemptInterrupted(JobsError):
    """Names an attempt that ended without an exception from the job function, where an
    exception class is expected: in the ``errors`` of a Tasks-framework ``TaskResult``."""


class AttemptTimedOut(AttemptInterrupted):
    """The attempt ran past its timeout and was stopped."""


class AttemptCrashed(AttemptInterrupted):
    """The process running the attempt died (``os._exit``, a segfault, the OOM killer)."""


class AttemptLost(AttemptInterrupted):
    """The attempt's worker disappeared; the reaper ended the attempt."""


class AttemptCancelled(AttemptInterrupted):
    """The job was cancelled while the attempt ran."""
