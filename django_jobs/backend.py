"""The backend of Django's Tasks framework: ``@task`` functions run as django-jobs jobs.

```python
TASKS = {"default": {"BACKEND": "django_jobs.backend.JobsBackend",
                     "QUEUES": ["default", "reports"],
                     "OPTIONS": {"max_attempts": 3, "timeout": 600}}}
```

``task.enqueue(...)`` stores a :class:`~django_jobs.models.Job` through :mod:`django_jobs.enqueue`
(the same checks, the caller's transaction, the same wake-up), and ``runjobworker`` runs it next
to ``@job`` functions with the same retries, timeouts and reaping. A ``TaskResult`` is read back
from the job and its attempts.

A worker runs only registered functions. A ``@task`` function is registered here when the backend
validates it, which the framework does when the decorator runs, that is when its module is
imported; workers import every installed app's ``tasks.py`` at startup (see ``apps.py``). A job
row only names a task; nothing named by a row is ever imported.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.db import connections, transaction
from django.utils import timezone

from django_jobs import compat, conf
from django_jobs.exceptions import (
    AttemptCancelled,
    AttemptCrashed,
    AttemptInterrupted,
    AttemptLost,
    AttemptTimedOut,
    Fail,
    InvalidOption,
    InvalidResult,
    JobsError,
    Retry,
)
from django_jobs.registry import BackoffPolicy, registry, validate_options
from django_jobs.sanitize import format_exception
from django_jobs.states import UNSUCCESSFUL_OUTCOMES, Outcome, State
from django_jobs.tasks import Task as JobTask

if TYPE_CHECKING:
    from django_jobs.context import JobContext
    from django_jobs.models.attempt import Attempt
    from django_jobs.models.job import Job

Status = compat.TaskResultStatus

#: How a job's state reads as a TaskResult's status.
STATUS: dict[str, Any] = {
    State.WAITING: Status.READY,
    State.PENDING: Status.READY,
    State.RUNNING: Status.RUNNING,
    State.DONE: Status.SUCCESSFUL,
    State.ERROR: Status.FAILED,
    State.CANCELLED: Status.FAILED,
}
_FINISHED = frozenset({Status.SUCCESSFUL, Status.FAILED})

#: Attempts that ended without success and without an exception from the function, and the
#: class that names each in a TaskError. (An ``error`` attempt is named by its exception's class.)
_INTERRUPTIONS: dict[str, type[AttemptInterrupted]] = {
    Outcome.TIMEOUT: AttemptTimedOut,
    Outcome.CRASHED: AttemptCrashed,
    Outcome.LOST: AttemptLost,
    Outcome.CANCELLED: AttemptCancelled,
}

OPTIONS = ("max_attempts", "timeout", "retry_backoff")

_CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*")


class JobsBackend(compat.BaseTaskBackend):
    """Runs the Tasks framework's ``@task`` functions as django-jobs jobs.

    ``OPTIONS``: ``max_attempts`` (default ``JOBS_DEFAULT_MAX_ATTEMPTS``), ``timeout`` in
    seconds (default ``JOBS_DEFAULT_TIMEOUT``) and ``retry_backoff`` (``(base, cap)`` seconds,
    default ``JOBS_RETRY_BACKOFF``). ``QUEUES`` lists the queues tasks may name.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.max_attempts, self.timeout, self.retry_backoff = _parse_options(alias, self.options)

    # ------------------------------------------------------------------ the contract

    def validate_task(self, task: compat.Task) -> None:
        """Refuse a task this backend cannot run (raising ``InvalidTask``); register one it can.

        The framework calls this when ``@task`` creates a task and on every ``using()``, so a
        task is on the workers' allow-list as soon as its module has been imported.
        """
        super().validate_task(task)
        try:
            validate_options(queue=task.queue_name, priority=task.priority)
        except InvalidOption as exc:
            raise compat.InvalidTask(str(exc)) from exc
        self._register(task)

    def enqueue(
        self, task: compat.Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> compat.TaskResult:
        """Store a job for ``task(*args, **kwargs)`` and return its ``TaskResult`` (READY).

        Inside ``transaction.atomic()`` on ``JOBS_DATABASE`` the job is part of that
        transaction: workers see it once it commits, and it never existed if it rolls back.
        ``task_enqueued`` is sent once the job is committed.
        """
        from django_jobs.enqueue import enqueue

        self.validate_task(task)
        call = registry.get(task.module_path).using(
            queue=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
            max_attempts=self.max_attempts,
            timeout=self.timeout,
        )
        job = enqueue(call, args, kwargs)
        result = self._result(job, attempts=[], task=task)
        transaction.on_commit(
            functools.partial(compat.task_enqueued.send, type(self), task_result=result),
            using=conf.database_alias(),
        )
        return result

    def get_result(self, result_id: str) -> compat.TaskResult:
        """Read the ``TaskResult`` of job ``result_id`` (a job id); raise
        ``TaskResultDoesNotExist`` if there is no such job or it does not run a ``@task``."""
        return self._read(_job_id(result_id))

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return [*super().check(**kwargs), *self._problems()]

    def _problems(self) -> Iterator[checks.CheckMessage]:
        name = f"{type(self).__name__} (TASKS[{self.alias!r}])"
        if not apps.is_installed("django_jobs"):
            yield checks.Error(
                f"{name} stores tasks as django-jobs jobs, but 'django_jobs' is not in "
                "INSTALLED_APPS.",
                hint="Add 'django_jobs' to INSTALLED_APPS and run `manage.py migrate`.",
                id="django_jobs.E001",
            )
        alias = conf.database_alias()
        if alias not in connections.settings:
            yield checks.Error(
                f"{name} stores jobs in database {alias!r} (JOBS_DATABASE), which is not in "
                "DATABASES.",
                id="django_jobs.E002",
            )
        elif connections[alias].vendor != "postgresql":
            yield checks.Error(
                f"{name} stores jobs in database {alias!r} (JOBS_DATABASE), which is "
                f"{connections[alias].vendor}; django-jobs needs PostgreSQL.",
                id="django_jobs.E003",
            )

    # ------------------------------------------------------------------ helpers

    def _register(self, task: compat.Task) -> None:
        existing = registry.find(task.module_path)
        if existing is not None and existing.func is task.func and existing.runner is not None:
            return  # a using() copy, or this backend validating it again
        try:
            registry.register(
                JobTask(
                    func=task.func,
                    name=task.module_path,
                    queue=task.queue_name,
                    priority=task.priority,
                    max_attempts=self.max_attempts,
                    timeout=self.timeout,
                    takes_context=task.takes_context,
                    retry_backoff=self.retry_backoff,
                    runner=TaskRunner(task),
                )
            )
        except JobsError as exc:
            raise compat.InvalidTask(str(exc)) from exc

    def _read(self, job_id: int, through_attempt: int | None = None) -> compat.TaskResult:
        from django_jobs.models.job import Job

        job = Job.objects.using(conf.database_alias()).filter(pk=job_id).first()
        if job is None:
            raise compat.TaskResultDoesNotExist(str(job_id))
        entry = registry.find(job.task)
        if entry is None or not isinstance(entry.runner, TaskRunner):
            raise compat.TaskResultDoesNotExist(
                f"job {job_id} runs {job.task!r}, which is not a @task function known to this "
                "process"
            )
        # A released attempt (handed back at shutdown) did not count: it is no attempt here.
        attempts = job.attempts.exclude(outcome=Outcome.RELEASED)
        if through_attempt is not None:
            attempts = attempts.filter(number__lte=through_attempt)
        return self._result(
            job, list(attempts.order_by("number", "id")), task=self._task_of(entry.runner.task, job)
        )

    def _task_of(self, registered: compat.Task, job: Job) -> compat.Task:
        """The task as this job runs it: its queue, priority and ``run_after``."""
        # The job's run_after is when it may next run; it names a deferral only if it lies
        # after the enqueue (a job that was ready at once has run_after <= created_at).
        run_after = job.run_after if job.run_after > job.created_at else None
        try:
            return registered.using(
                priority=job.priority, queue_name=job.queue, run_after=run_after, backend=self.alias
            )
        except compat.InvalidTask:
            # Say, its queue was removed from QUEUES since: still read the result.
            return registered

    def _result(
        self, job: Job, attempts: Sequence[Attempt], *, task: compat.Task
    ) -> compat.TaskResult:
        status = STATUS[job.state]
        result: compat.TaskResult = compat.TaskResult(
            task=task,
            id=str(job.pk),
            status=status,
            enqueued_at=job.created_at,
            started_at=attempts[0].started_at if attempts else None,
            last_attempted_at=attempts[-1].started_at if attempts else None,
            finished_at=job.finished_at if status in _FINISHED else None,
            args=job.args,
            kwargs=job.kwargs,
            backend=self.alias,
            errors=[_task_error(a) for a in attempts if a.outcome in UNSUCCESSFUL_OUTCOMES],
            worker_ids=[a.worker_id for a in attempts],
        )
        if status == Status.SUCCESSFUL:
            object.__setattr__(result, "_return_value", job.result)
        return result


@dataclasses.dataclass(frozen=True)
class TaskRunner:
    """Runs a ``@task`` function in a worker's executor process, the way the framework does.

    It reads the job's ``TaskResult`` (status RUNNING, one worker id per attempt so far), sends
    ``task_started``, calls the function (with a ``TaskContext`` if it takes one), and sends
    ``task_finished`` with the attempt's outcome before the worker records it: SUCCESSFUL with
    the return value; FAILED with the new error; or READY with the new error when the job will
    be retried. A job that is stopped (timeout, cancellation, crash) gets no ``task_finished``.
    """

    task: compat.Task

    def __call__(
        self,
        context: JobContext,
        call: Callable[[list[Any], dict[str, Any]], Any],
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        backend = self.task.get_backend()
        if not isinstance(backend, JobsBackend):
            raise JobsError(
                f"task {self.task.module_path} names backend {self.task.backend!r}, which is "
                f"no longer a JobsBackend (TASKS[{self.task.backend!r}] changed)"
            )
        sender = type(backend)
        # The result as this run sees it, even if its lease was lost meanwhile: running, with
        # one worker id per attempt up to this one, so that TaskContext.attempt is this attempt.
        result = backend._read(context.job_id, through_attempt=context.attempt)
        _update(result, Status.RUNNING)
        compat.task_started.send(sender=sender, task_result=result)
        try:
            if self.task.takes_context:
                args = [compat.TaskContext(task_result=result), *args]
            value = _json_value(call(args, kwargs))
        except BaseException as exc:
            # The worker retries a failure unless it is a Fail or the last attempt (the finish
            # function, store/sql/functions/django_jobs_finish_v*.sql, decides the same way).
            retried = not isinstance(exc, Fail) and context.attempt < context.max_attempts
            result.errors.append(
                compat.TaskError(
                    exception_class_path=_class_path(
                        getattr(exc, "reported_as", None) or type(exc)
                    ),
                    traceback=format_exception(exc),
                )
            )
            _update(result, Status.READY if retried else Status.FAILED)
            # Sent inside the except block, as the framework does, so receivers can log exc_info.
            compat.task_finished.send(sender=sender, task_result=result)
            raise
        _update(result, Status.SUCCESSFUL, value)
        compat.task_finished.send(sender=sender, task_result=result)
        return value


def _update(result: compat.TaskResult, status: Any, value: Any = None) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now() if status in _FINISHED else None)
    object.__setattr__(result, "_return_value", value)


def _json_value(value: Any) -> Any:
    """The return value as plain JSON (the framework's normalization), or a :class:`Fail`."""
    try:
        value = compat.normalize_json(value)
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidResult(
            f"the task returned {type(value).__name__}, which is not JSON: {exc}"
        ) from exc
    return value


def _task_error(attempt: Attempt) -> compat.TaskError:
    if attempt.outcome == Outcome.ERROR:
        # An exception of the function has a traceback; an attempt the worker refused (unknown
        # task, bad arguments) has only its message.
        path = _exception_class_path(attempt.error) if attempt.traceback else None
    else:
        path = _class_path(_INTERRUPTIONS[attempt.outcome])
    return compat.TaskError(
        exception_class_path=path or _class_path(JobsError),
        traceback=attempt.traceback or attempt.error,
    )


def _exception_class_path(summary: str) -> str | None:
    """The exception class named by an attempt's error summary, ``"module.Class: message"``
    (the executor leaves out ``builtins.`` and words a :class:`Retry` as ``"Retry: reason"``)."""
    head = summary.split(": ", 1)[0].strip()
    if head == "Retry":
        return _class_path(Retry)
    if not _CLASS_PATH.fullmatch(head):
        return None
    return head if "." in head else f"builtins.{head}"


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _job_id(result_id: Any) -> int:
    try:
        job_id = int(str(result_id))
    except ValueError:
        raise compat.TaskResultDoesNotExist(result_id) from None
    if not 0 < job_id < 2**63:
        raise compat.TaskResultDoesNotExist(result_id)
    return job_id


def _parse_options(
    alias: str, options: Mapping[str, Any]
) -> tuple[int | None, int | None, BackoffPolicy | None]:
    where = f"TASKS[{alias!r}]['OPTIONS']"
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise compat.InvalidTaskBackend(
            f"{where} has unknown option(s) {', '.join(unknown)}; JobsBackend takes "
            f"{', '.join(OPTIONS)}."
        )
    max_attempts = options.get("max_attempts")
    timeout = options.get("timeout")
    try:
        validate_options(max_attempts=max_attempts, timeout=timeout)
    except InvalidOption as exc:
        raise compat.InvalidTaskBackend(f"{where}: {exc}") from exc
    backoff = options.get("retry_backoff")
    if backoff is not None and not callable(backoff):
        try:
            base, cap = (float(x) for x in backoff)
        except (TypeError, ValueError):
            raise compat.InvalidTaskBackend(
                f"{where}: retry_backoff must be a (base, cap) pair of seconds or a function of "
                f"the attempt number, not {backoff!r}"
            ) from None
        backoff = (base, cap)
    return max_attempts, timeout, backoff
