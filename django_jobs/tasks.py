"""Tasks: the functions a job runs, with their options, declared with ``@job`` (or
``remote_job()`` for tasks that workers of the HTTP API run) and enqueued with
``task.enqueue(...)``. Each is registered in :data:`django_jobs.registry.registry`, the
allow-list that workers look names up in.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from django_jobs import conf
from django_jobs.exceptions import InvalidOption, JobsError
from django_jobs.rates import Rate, parse_rate
from django_jobs.registry import BackoffPolicy, Runner, origin, registry, validate_options
from django_jobs.storable import unstorable

if TYPE_CHECKING:
    from django_jobs.models.job import Job

_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class Task:
    """A registered job function, with its default options.

    Call it to run the function inline; ``enqueue()`` it to run it on a worker.
    ``using(...)`` returns a copy with per-call options.
    """

    func: Callable[..., Any]
    name: str
    queue: str
    priority: int = 0
    max_attempts: int | None = None
    timeout: int | None = None
    takes_context: bool = False
    retry_backoff: BackoffPolicy | None = None
    # Set for @task functions of Django's Tasks framework (django_jobs.backend), which take a
    # TaskContext and send the framework's signals around each run.
    runner: Runner | None = None
    # A cron expression: the task also runs periodically, as the schedule named after it.
    schedule: str | None = None
    # Declared here and run elsewhere, by workers of the HTTP API (see remote_job()).
    remote: bool = False
    # At most this many running jobs share a concurrency key (the call's, else the task's name).
    concurrency_limit: int | None = None
    # Seconds a job of this task is expected to run at most: past it, the django_jobs_alerts
    # view reports the job overdue (without it, a job far past the task's own p95 is).
    expected_duration: int | None = None
    # At most N starts of the task (or of the call's rate_key) in any window: "10/s", "100/m",
    # "10/2s" (rates.py).
    rate_limit: str | None = None
    # Seconds from enqueue after which a job that has not started never runs (it ends
    # cancelled, as expired).
    expires_after: float | timedelta | None = None
    # Per-call options, set through using():
    run_after: datetime | timedelta | None = None
    depends_on: tuple[Any, ...] = ()
    parent: Any = None
    unique_key: str | None = None
    concurrency_key: str | None = None
    rate_key: str | None = None
    expires_at: datetime | None = None

    def __post_init__(self) -> None:
        validate_options(
            queue=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
            timeout=self.timeout,
            run_after=self.run_after,
            unique_key=self.unique_key,
            concurrency_key=self.concurrency_key,
            concurrency_limit=self.concurrency_limit,
            expected_duration=self.expected_duration,
            rate_key=self.rate_key,
            rate_limit=self.rate_limit,
            expires_after=self.expires_after,
            expires_at=self.expires_at,
        )
        if self.rate_key is not None and self.rate_limit is None:
            raise InvalidOption(
                f"rate_key {self.rate_key!r} needs a rate limit: give the task one with"
                " @job(rate_limit='10/s'), or the call with using(rate_limit=...)"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    def using(
        self,
        *,
        queue: str = _UNSET,
        priority: int = _UNSET,
        run_after: datetime | timedelta | None = _UNSET,
        max_attempts: int | None = _UNSET,
        timeout: int | None = _UNSET,
        depends_on: Iterable[Any] = _UNSET,
        parent: Any = _UNSET,
        unique_key: str | None = _UNSET,
        concurrency_key: str | None = _UNSET,
        concurrency_limit: int | None = _UNSET,
        rate_key: str | None = _UNSET,
        rate_limit: str | None = _UNSET,
        expires_at: datetime | None = _UNSET,
        expires_after: float | timedelta | None = _UNSET,
    ) -> Task:
        """Return a copy of this task with per-call options.

        ``run_after`` takes an aware datetime, or a timedelta counted from the database's
        ``now()`` at enqueue time. At most ``concurrency_limit`` running jobs share a
        ``concurrency_key``, across all workers (see :attr:`concurrency`). At most
        ``rate_limit`` attempts (``"10/s"``) of the jobs that share a ``rate_key`` start in any
        window of its length (see :attr:`rate`). A job that has not started by ``expires_at``
        (or ``expires_after`` seconds after its enqueue) never runs: it ends cancelled, as
        expired.
        """
        changes: dict[str, Any] = {
            key: value
            for key, value in {
                "queue": queue,
                "priority": priority,
                "run_after": run_after,
                "max_attempts": max_attempts,
                "timeout": timeout,
                "parent": parent,
                "unique_key": unique_key,
                "concurrency_key": concurrency_key,
                "concurrency_limit": concurrency_limit,
                "rate_key": rate_key,
                "rate_limit": rate_limit,
                "expires_at": expires_at,
                "expires_after": expires_after,
            }.items()
            if value is not _UNSET
        }
        if depends_on is not _UNSET:
            changes["depends_on"] = tuple(depends_on)
        return dataclasses.replace(self, **changes)

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """Store a job that runs ``func(*args, **kwargs)`` on a worker, and return it.

        Inside ``transaction.atomic()`` the job exists only if that transaction commits.
        """
        # Imported here: ``django_jobs`` imports this module while Django loads its apps, before
        # the models that enqueueing writes can be imported.
        from django_jobs.enqueue import enqueue

        return enqueue(self, args, kwargs)

    def enqueue_many(self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
        """Store one job per ``(args, kwargs)`` pair in a single statement; return them in order."""
        from django_jobs.enqueue import enqueue_many

        return enqueue_many(self, calls)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before the attempt after ``attempt`` (1-based) failed."""
        policy = self.retry_backoff if self.retry_backoff is not None else conf.retry_backoff()
        if callable(policy):
            return max(0.0, float(policy(attempt)))
        base, cap = policy
        ceiling = min(cap, base * 2 ** max(0, attempt - 1))
        # "Equal jitter": never less than half the delay, so retries cannot bunch up at zero.
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    @property
    def concurrency(self) -> tuple[str, int] | None:
        """The ``(key, limit)`` a job of this call is held to, or ``None``: the call's key, else
        the task's name when the task has a limit; the call's limit, else the task's, else 1."""
        key = self.concurrency_key
        if key is None and self.concurrency_limit is not None:
            key = self.name
        if key is None:
            return None
        return key, self.concurrency_limit if self.concurrency_limit is not None else 1

    @property
    def rate(self) -> tuple[str, Rate] | None:
        """The ``(key, rate)`` a job of this call is held to, or ``None``: the call's
        ``rate_key``, else the task's name; the call's ``rate_limit``, else the task's."""
        if self.rate_limit is None:
            return None
        return self.rate_key or self.name, parse_rate(self.rate_limit)

    @property
    def effective_max_attempts(self) -> int:
        return self.max_attempts if self.max_attempts is not None else conf.default_max_attempts()

    @property
    def effective_timeout(self) -> int | None:
        return self.timeout if self.timeout is not None else conf.default_timeout()


def _served_remotely(*args: Any, **kwargs: Any) -> Any:
    raise JobsError(
        "this task is declared with remote_job() or JOBS_REMOTE_TASKS: workers of the HTTP API"
        " run it, and this process has no function for it"
    )


@overload
def job(func: Callable[..., Any], /) -> Task: ...
@overload
def job(
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: int | None = None,
    takes_context: bool = False,
    retry_backoff: BackoffPolicy | None = None,
    schedule: str | None = None,
    concurrency_limit: int | None = None,
    expected_duration: int | None = None,
    rate_limit: str | None = None,
    expires_after: float | timedelta | None = None,
) -> Callable[[Callable[..., Any]], Task]: ...
def job(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: int | None = None,
    takes_context: bool = False,
    retry_backoff: BackoffPolicy | None = None,
    schedule: str | None = None,
    concurrency_limit: int | None = None,
    expected_duration: int | None = None,
    rate_limit: str | None = None,
    expires_after: float | timedelta | None = None,
) -> Task | Callable[[Callable[..., Any]], Task]:
    """Register a function as a job task. Works bare (``@job``) or with options.

    ``name`` defaults to ``module.qualname``; ``queue`` to ``JOBS_DEFAULT_QUEUE``;
    ``max_attempts`` to ``JOBS_DEFAULT_MAX_ATTEMPTS``; ``timeout`` (seconds) to
    ``JOBS_DEFAULT_TIMEOUT``. With ``takes_context=True`` the function receives a
    :class:`~django_jobs.context.JobContext` as its first argument. ``retry_backoff`` is a
    ``(base, cap)`` pair of seconds or a function of the failed attempt number. ``schedule``
    (a cron expression, UTC) also runs it periodically, as the schedule named after the task
    (see :mod:`django_jobs.schedules.declarations`; an invalid expression is a system check error).
    ``concurrency_limit`` caps the running jobs that share a concurrency key across all
    workers: the key given with ``using(concurrency_key=...)``, else the task's name.
    ``expected_duration`` (seconds) is how long a job of the task should run at most: one
    running longer is reported by the ``django_jobs_alerts`` view and ``manage.py jobsalerts``
    (without it, one running far past the task's own p95 is; see docs/operations.md).
    ``rate_limit`` (``"10/s"``, ``"100/m"``, ``"1000/h"``, ``"10/2s"``, ``"5/30m"``) lets at most
    that many attempts of the task start in any window of that length, across all workers: per
    ``using(rate_key=...)`` when the call gives a key. ``expires_after`` (seconds) is a deadline
    counted from each enqueue: a job that has not started by then never runs, and ends
    cancelled, as expired.
    """

    def decorate(f: Callable[..., Any]) -> Task:
        if not callable(f):
            raise InvalidOption(f"@job decorates a function, not {f!r}")
        task = Task(
            func=f,
            name=name or origin(f),
            queue=queue or conf.default_queue(),
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            takes_context=takes_context,
            retry_backoff=retry_backoff,
            schedule=schedule,
            concurrency_limit=concurrency_limit,
            expected_duration=expected_duration,
            rate_limit=rate_limit,
            expires_after=expires_after,
        )
        return registry.register(task)

    if func is not None:
        return decorate(func)
    return decorate


def remote_job(
    name: str,
    *,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: int | None = None,
    concurrency_limit: int | None = None,
    expected_duration: int | None = None,
    rate_limit: str | None = None,
    expires_after: float | timedelta | None = None,
) -> Task:
    """Declare a task that workers of the HTTP API run (in another language, another cluster),
    so that its jobs can be enqueued here, checked like any other: ``remote_job("ml.train",
    queue="gpu", timeout=7200)``. Enqueue it with the returned task's ``enqueue()``, or by its
    name (``django_jobs.enqueue.enqueue("ml.train", args, kwargs)``). Database-connected
    workers never claim its jobs. ``JOBS_REMOTE_TASKS`` declares the same from the settings."""
    if not isinstance(name, str) or not name or len(name) > 200 or unstorable(name):
        raise InvalidOption(f"a remote task needs a name of 1 to 200 characters, not {name!r}")
    task = Task(
        func=_served_remotely,
        name=name,
        queue=queue or conf.default_queue(),
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        concurrency_limit=concurrency_limit,
        expected_duration=expected_duration,
        rate_limit=rate_limit,
        expires_after=expires_after,
        remote=True,
    )
    return registry.register(task)


#: The options a remote task takes, in ``JOBS_REMOTE_TASKS`` as in :func:`remote_job`.
REMOTE_OPTIONS = frozenset(
    {
        "queue",
        "priority",
        "max_attempts",
        "timeout",
        "concurrency_limit",
        "expected_duration",
        "rate_limit",
        "expires_after",
    }
)


def declare_remote_tasks(declared: Mapping[str, Any]) -> list[Task]:
    """Declare the tasks of ``JOBS_REMOTE_TASKS`` (``{"ml.train": {"queue": "gpu"}}``); raise
    :class:`InvalidOption` naming the first bad entry."""
    if not isinstance(declared, Mapping):
        raise InvalidOption(
            f"JOBS_REMOTE_TASKS must be a dict of task name to options, not {declared!r}"
        )
    tasks = []
    for name, options in declared.items():
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise InvalidOption(f"JOBS_REMOTE_TASKS[{name!r}] must be a dict of options")
        unknown = sorted(set(options) - REMOTE_OPTIONS)
        if unknown:
            raise InvalidOption(
                f"JOBS_REMOTE_TASKS[{name!r}] has unknown option(s) {', '.join(unknown)};"
                f" it takes {', '.join(sorted(REMOTE_OPTIONS))}"
            )
        try:
            tasks.append(remote_job(name, **options))
        except InvalidOption as error:
            raise InvalidOption(f"JOBS_REMOTE_TASKS[{name!r}]: {error}") from None
    return tasks
