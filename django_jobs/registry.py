"""The task registry: the allow-list of functions a worker will run.

A job row names a task by its registered name. Workers look that name up here and never import
anything named by a row; an unknown name fails the attempt with a clear message. The tasks
themselves (:class:`~django_jobs.tasks.Task`, ``@job``, ``remote_job``) are in
:mod:`django_jobs.tasks`, which enqueues; this module sits below enqueueing, so that
:mod:`django_jobs.enqueue` can look names up without an import circle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_jobs import conf
from django_jobs.exceptions import InvalidOption, JobsError, UnknownTask
from django_jobs.rates import parse_rate
from django_jobs.storable import unstorable

if TYPE_CHECKING:
    from django_jobs.context import JobContext
    from django_jobs.tasks import Task

BackoffPolicy = tuple[float, float] | Callable[[int], float]

#: How a worker runs a task whose calls need more than ``func(*args, **kwargs)``. It receives the
#: run's :class:`~django_jobs.context.JobContext`, a ``call(args, kwargs)`` that runs ``func`` to
#: its end (a coroutine function in an event loop of its own), and the job's arguments; it
#: returns the function's result or raises its exception.
Runner = Callable[
    ["JobContext", Callable[[list[Any], dict[str, Any]], Any], list[Any], dict[str, Any]], Any
]


def validate_options(
    *,
    queue: Any = None,
    priority: Any = 0,
    max_attempts: Any = None,
    timeout: Any = None,
    run_after: Any = None,
    unique_key: Any = None,
    concurrency_key: Any = None,
    concurrency_limit: Any = None,
    expected_duration: Any = None,
    rate_key: Any = None,
    rate_limit: Any = None,
    expires_after: Any = None,
    expires_at: Any = None,
) -> None:
    """Raise :class:`InvalidOption` with a precise message for any out-of-range option."""
    why = unstorable(queue) if isinstance(queue, str) else None
    if queue is not None and (not isinstance(queue, str) or not queue or len(queue) > 100 or why):
        raise InvalidOption(
            f"queue must be a non-empty string of at most 100 characters, not {queue!r}"
            + (f": it {why}" if why else "")
        )
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise InvalidOption(f"priority must be an integer from -100 to 100, not {priority!r}")
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_INT
    ):
        raise InvalidOption(
            f"max_attempts must be an integer from 1 to {MAX_INT}, not {max_attempts!r}"
        )
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= MAX_INT
    ):
        raise InvalidOption(
            f"timeout must be a whole number of seconds from 1 to {MAX_INT}, or None,"
            f" not {timeout!r}"
        )
    if expected_duration is not None and (
        isinstance(expected_duration, bool)
        or not isinstance(expected_duration, int)
        or not 1 <= expected_duration <= MAX_INT
    ):
        raise InvalidOption(
            f"expected_duration must be a whole number of seconds from 1 to {MAX_INT}, or None,"
            f" not {expected_duration!r}"
        )
    if run_after is not None:
        if isinstance(run_after, datetime):
            if run_after.tzinfo is None or run_after.utcoffset() is None:
                raise InvalidOption(
                    "run_after must be an aware datetime (use django.utils.timezone)"
                )
        elif not isinstance(run_after, timedelta):
            raise InvalidOption(f"run_after must be a datetime or a timedelta, not {run_after!r}")
        else:
            _check_delay(run_after)
    if unique_key is not None and (
        not isinstance(unique_key, str) or not unique_key or len(unique_key) > 255
    ):
        raise InvalidOption("unique_key must be a non-empty string of at most 255 characters")
    if isinstance(unique_key, str) and (why := unstorable(unique_key)) is not None:
        raise InvalidOption(f"unique_key {why}")
    if concurrency_key is not None and (
        not isinstance(concurrency_key, str)
        or not concurrency_key.strip()
        or len(concurrency_key) > 255
    ):
        raise InvalidOption(
            "concurrency_key must be a non-empty string of at most 255 characters,"
            f" not {concurrency_key!r}"
        )
    if isinstance(concurrency_key, str) and (why := unstorable(concurrency_key)) is not None:
        raise InvalidOption(f"concurrency_key {why}")
    if concurrency_limit is not None and (
        isinstance(concurrency_limit, bool)
        or not isinstance(concurrency_limit, int)
        or not 1 <= concurrency_limit <= MAX_INT
    ):
        raise InvalidOption(
            f"concurrency_limit must be an integer from 1 to {MAX_INT}, not {concurrency_limit!r}"
        )
    _check_time_controls(rate_key, rate_limit, expires_after, expires_at)


def _check_time_controls(
    rate_key: Any, rate_limit: Any, expires_after: Any, expires_at: Any
) -> None:
    if rate_limit is not None:
        parse_rate(rate_limit)
    if rate_key is not None:
        if not isinstance(rate_key, str) or not rate_key.strip() or len(rate_key) > 255:
            raise InvalidOption(
                f"rate_key must be a non-empty string of at most 255 characters, not {rate_key!r}"
            )
        if (why := unstorable(rate_key)) is not None:
            raise InvalidOption(f"rate_key {why}")
    if expires_after is not None and (
        isinstance(expires_after, bool)
        or not isinstance(expires_after, int | float | timedelta)
        or not 0 < _seconds(expires_after) <= MAX_EXPIRY
    ):
        raise InvalidOption(
            "expires_after must be a number of seconds (or a timedelta) greater than 0 and at"
            f" most {MAX_EXPIRY} (10 years), not {expires_after!r}"
        )
    if expires_at is not None and (
        not isinstance(expires_at, datetime)
        or expires_at.tzinfo is None
        or expires_at.utcoffset() is None
    ):
        raise InvalidOption(
            f"expires_at must be an aware datetime (use django.utils.timezone), not {expires_at!r}"
        )


def _seconds(value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return seconds if math.isfinite(seconds) else -1.0


#: The longest expires_after: ten years, in seconds.
MAX_EXPIRY = 10 * 365 * 86400


#: The largest max_attempts, timeout and expected_duration: the columns are PostgreSQL integers.
MAX_INT = 2**31 - 1


def _check_delay(delay: timedelta) -> None:
    # The moment must be one that Python can read back (years 1 to 9999); the database's clock
    # adds it at enqueue, so leave a day of room for the two clocks to differ.
    try:
        moment = datetime.now(UTC) + delay
        ok = datetime.min.replace(tzinfo=UTC) + timedelta(days=1) < moment
        ok = ok and moment < datetime.max.replace(tzinfo=UTC) - timedelta(days=1)
    except OverflowError:
        ok = False
    if not ok:
        raise InvalidOption(
            f"run_after={delay!r} is out of range: the job would run outside the years 1 to 9999"
        )


class Registry:
    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def register(self, task: Task) -> Task:
        existing = self._tasks.get(task.name)
        if existing is not None and origin(existing.func) != origin(task.func):
            raise JobsError(
                f"two different functions are registered as task {task.name!r}: "
                f"{origin(existing.func)} and {origin(task.func)}. Give one of them a name=."
            )
        self._tasks[task.name] = task
        return task

    def get(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(name) from None

    def find(self, name: str) -> Task | None:
        """The task registered as ``name``, or None."""
        return self._tasks.get(name)

    def backoff_for(self, name: str, attempt: int) -> float:
        """Seconds before a job of task ``name`` runs again after attempt ``attempt`` failed.
        A name not registered here (say, mid rolling deploy) gets the first step of
        ``JOBS_RETRY_BACKOFF``."""
        task = self.find(name)
        return task.backoff(attempt) if task is not None else conf.retry_backoff()[0]

    def max_attempts_for(self, name: str, fallback: int) -> int:
        """The attempts a retried job of task ``name`` gets: its task's ``max_attempts``, or
        ``fallback`` (the job's own) for a name not registered here."""
        task = self.find(name)
        return task.effective_max_attempts if task is not None else fallback

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def all(self) -> list[Task]:
        return list(self._tasks.values())

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def local_names(self) -> list[str]:
        """The tasks a worker of this app runs itself: all but the remote ones."""
        return sorted(name for name, task in self._tasks.items() if not task.remote)

    def remote_names(self) -> list[str]:
        """The tasks that workers of the HTTP API run (see :func:`remote_job`)."""
        return sorted(name for name, task in self._tasks.items() if task.remote)

    def queues(self) -> list[str]:
        """The queues in use, for the admin's filters and the queue controls: ``JOBS_QUEUES``,
        else the default queue plus every queue named by a registered task."""
        configured = conf.queues()
        if configured is not None:
            return configured
        return sorted({conf.default_queue(), *(task.queue for task in self._tasks.values())})

    def runs_here(self, name: str) -> bool:
        """Whether a worker of this app has the function of task ``name``."""
        task = self._tasks.get(name)
        return task is not None and not task.remote


def origin(func: Callable[..., Any]) -> str:
    """A function's dotted path: the default name of its task."""
    return f"{func.__module__}.{func.__qualname__}"


registry = Registry()
