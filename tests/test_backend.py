"""The backend of Django's Tasks framework: the BaseTaskBackend contract, on django-jobs."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.test.utils import override_settings
from django.utils import timezone

from django_jobs import InvalidPayload, job
from django_jobs.backend import JobsBackend
from django_jobs.compat import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task,
    task_backends,
)
from django_jobs.context import JobContext
from django_jobs.exceptions import AttemptCrashed, AttemptLost, AttemptTimedOut
from django_jobs.models import Job
from django_jobs.registry import registry
from testproject.testjobs import tasks
from testproject.testjobs.jobs import echo
from testproject.testjobs.models import Execution, TaskSignal
from tests.conftest import connect
from tests.factories import AttemptFactory, JobFactory

Status = TaskResultStatus
BACKEND = "django_jobs.backend.JobsBackend"


# ---------------------------------------------------------------------------- the backend


def test_the_backend_supports_defer_priority_results_and_async_tasks() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, JobsBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_a_task_is_on_the_workers_allow_list_once_its_module_is_imported() -> None:
    entry = registry.get(tasks.send_digest.module_path)
    assert entry.func is tasks.send_digest.func
    assert (entry.queue, entry.priority, entry.max_attempts, entry.timeout) == (
        "reports",
        10,
        2,
        120,
    )
    assert registry.get(tasks.async_double.module_path).is_async


def test_a_plain_function_in_a_tasks_module_is_not_on_the_allow_list() -> None:
    assert registry.find(f"{tasks.__name__}.not_a_task") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"queue_name": "imports"}, "Queue 'imports' is not valid for backend"),
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"run_after": timezone.now().replace(tzinfo=None)}, "run_after must be an aware"),
    ],
)
def test_invalid_task_options_are_refused_by_validate_task(change: dict, message: str) -> None:
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**change)


def test_a_task_must_be_a_module_level_function_that_names_its_context() -> None:
    def local() -> None: ...

    with pytest.raises(InvalidTask, match="module level"):
        task(local)
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(tasks.not_a_task)


def plain_function() -> None: ...


def test_a_task_cannot_take_the_name_of_a_job_function() -> None:
    job(name=f"{__name__}.plain_function")(echo.func)
    with pytest.raises(InvalidTask, match="two different functions are registered"):
        task(plain_function)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attemps": 3}, "unknown option.*max_attemps.*takes max_attempts"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to"),
        ({"timeout": "1h"}, "timeout must be a whole number of seconds"),
        ({"retry_backoff": "fast"}, "retry_backoff must be a"),
    ],
)
def test_bad_options_fail_when_the_backend_is_created(options: dict, message: str) -> None:
    with pytest.raises(InvalidTaskBackend, match=message):
        JobsBackend("broken", {"OPTIONS": options})


def test_the_check_passes_when_the_app_is_installed() -> None:
    assert list(task_backends["default"].check()) == []


def test_the_system_check_fails_clearly_without_django_jobs_in_installed_apps() -> None:
    from django.conf import settings

    without = [app for app in settings.INSTALLED_APPS if app != "django_jobs"]
    with override_settings(INSTALLED_APPS=without):
        messages = list(task_backends["default"].check())
        assert [m.id for m in messages] == ["django_jobs.E001"]
        assert "'django_jobs' is not in INSTALLED_APPS" in messages[0].msg
        with pytest.raises(SystemCheckError, match=r"django_jobs\.E001"):
            call_command("check")


def test_the_check_fails_when_jobs_database_is_not_configured() -> None:
    with override_settings(JOBS_DATABASE="elsewhere"):
        messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_jobs.E002"]


# ---------------------------------------------------------------------------- enqueue


@pytest.mark.django_db
def test_enqueue_stores_a_job_with_the_tasks_queue_priority_and_the_backend_options() -> None:
    result = tasks.send_digest.enqueue(5)
    job = Job.objects.get(pk=int(result.id))
    assert job.task == "testproject.testjobs.tasks.send_digest"
    assert (job.queue, job.priority, job.args, job.kwargs) == ("reports", 10, [5], {})
    assert (job.max_attempts, job.timeout, job.state) == (2, 120, "pending")

    assert result.status == Status.READY and result.backend == "default"
    assert result.task is tasks.send_digest
    assert (result.args, result.kwargs) == ([5], {})
    assert result.enqueued_at == job.created_at
    assert result.started_at is result.finished_at is result.last_attempted_at is None
    assert (result.errors, result.worker_ids) == ([], [])
    with pytest.raises(ValueError, match="not finished yet"):
        _ = result.return_value


@pytest.mark.django_db
def test_using_maps_priority_queue_and_run_after_onto_the_job() -> None:
    at = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(priority=-40, queue_name="reports", run_after=at).enqueue(1, b=2)
    job = Job.objects.get(pk=int(result.id))
    assert (job.priority, job.queue, job.run_after) == (-40, "reports", at)
    assert (job.args, job.kwargs) == ([1], {"b": 2})
    read = tasks.add.get_result(result.id)
    assert (read.task.priority, read.task.queue_name, read.task.run_after) == (-40, "reports", at)


@pytest.mark.django_db
def test_arguments_must_be_json_and_nothing_is_written_otherwise() -> None:
    with pytest.raises(InvalidPayload, match="not JSON"):
        tasks.add.enqueue(object(), 1)
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_joins_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.add.enqueue(1, 2)
        raise RuntimeError("roll back")
    assert not Job.objects.filter(pk=int(rolled_back.id)).exists()

    with transaction.atomic():
        committed = tasks.add.enqueue(3, 4)
        with connect() as worker_view:
            seen = worker_view.execute(
                "SELECT count(*) FROM django_jobs_job WHERE id = %s", [int(committed.id)]
            ).fetchone()[0]
        assert seen == 0  # not visible to workers before the commit
        assert not TaskSignal.objects.filter(signal="task_enqueued").exists()
    assert Job.objects.filter(pk=int(committed.id), state="pending").exists()

    # task_enqueued was sent once, after the commit, and never for the rolled-back job.
    sent = TaskSignal.objects.get(signal="task_enqueued")
    assert (sent.result_id, sent.status, sent.sender) == (committed.id, "READY", BACKEND)
    assert sent.pid == os.getpid()


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result_work_from_async_code() -> None:
    result = async_to_sync(tasks.send_digest.aenqueue)(7)
    assert Job.objects.filter(pk=int(result.id), args=[7]).exists()
    read = async_to_sync(tasks.send_digest.aget_result)(result.id)
    assert (read.id, read.status, read.args) == (result.id, Status.READY, [7])


# ---------------------------------------------------------------------------- results


@pytest.mark.django_db
def test_get_result_raises_for_unknown_ids_and_for_jobs_that_are_not_tasks() -> None:
    backend = task_backends["default"]
    plain_job = echo.enqueue()
    unknown_task = JobFactory(task="myapp.tasks.removed_last_week")
    for result_id in ["999999999", "abc", "-1", str(2**70), str(plain_job.pk)]:
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist, match="not a @task function known"):
        backend.get_result(str(unknown_task.pk))


@pytest.mark.django_db
def test_get_result_of_another_tasks_id_is_a_mismatch() -> None:
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.send_digest.get_result(result.id)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("waiting", Status.READY),
        ("pending", Status.READY),
        ("running", Status.RUNNING),
        ("done", Status.SUCCESSFUL),
        ("error", Status.FAILED),
        ("cancelled", Status.FAILED),
    ],
)
@pytest.mark.django_db
def test_job_states_read_as_task_statuses(state: str, status: Status) -> None:
    extra = {"worker_id": "w:1:a", "started_at": timezone.now()} if state == "running" else {}
    if state in ("done", "error", "cancelled"):
        extra["finished_at"] = timezone.now()
    job = JobFactory(task=tasks.add.module_path, state=state, **extra)
    assert tasks.add.get_result(str(job.pk)).status == status


@pytest.mark.django_db
def test_a_result_lists_each_counted_attempts_worker_and_each_failures_error() -> None:
    now = timezone.now()
    job = JobFactory(
        task=tasks.add.module_path,
        args=[1, 2],
        state="done",
        attempt=5,
        max_attempts=5,
        started_at=now,
        finished_at=now + timedelta(seconds=9),
        result=3,
    )
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n'
    attempts = [
        ("w1", "error", "ValueError: bad", traceback),
        ("w2", "released", "released at worker shutdown", ""),  # handed back: not an attempt
        ("w3", "timeout", "timed out after 5s and was stopped", ""),
        ("w4", "crashed", "the job's process died (killed by SIGKILL)", ""),
        ("w5", "lost", "worker w5 is gone", ""),
        ("w6", "done", "", ""),
    ]
    number = 0
    for i, (worker, outcome, error, tb) in enumerate(attempts):
        number += outcome != "released"
        AttemptFactory(
            job=job,
            number=max(number, 1),
            worker_id=worker,
            outcome=outcome,
            error=error,
            traceback=tb,
            started_at=now + timedelta(seconds=i),
            finished_at=now + timedelta(seconds=i, milliseconds=500),
        )

    result = tasks.add.get_result(str(job.pk))
    assert result.status == Status.SUCCESSFUL and result.return_value == 3
    assert result.worker_ids == ["w1", "w3", "w4", "w5", "w6"] and result.attempts == 5
    assert [e.exception_class_path for e in result.errors] == [
        "builtins.ValueError",
        f"{AttemptTimedOut.__module__}.AttemptTimedOut",
        f"{AttemptCrashed.__module__}.AttemptCrashed",
        f"{AttemptLost.__module__}.AttemptLost",
    ]
    assert result.errors[0].exception_class is ValueError
    assert result.errors[0].traceback == traceback
    assert result.errors[1].exception_class is AttemptTimedOut
    assert result.errors[1].traceback == "timed out after 5s and was stopped"
    assert result.enqueued_at == job.created_at
    assert result.started_at == now  # the first attempt
    assert result.last_attempted_at == now + timedelta(seconds=5)
    assert result.finished_at == job.finished_at


@pytest.mark.parametrize(
    ("rows", "run_attempt", "worker_ids"),
    [
        # Released at a shutdown, then claimed again as attempt 1 by w1.
        ([(1, "w0", "released"), (1, "w1", "running")], 1, ["w1"]),
        # Attempt 1 by w1 was reaped and re-claimed by w2 while w1 went on: w1 still sees 1.
        ([(1, "w1", "lost"), (2, "w2", "running")], 1, ["w1"]),
    ],
)
@pytest.mark.django_db
def test_a_runs_task_context_counts_the_attempts_up_to_its_own(
    rows: list, run_attempt: int, worker_ids: list
) -> None:
    job = JobFactory(
        task=tasks.flaky.module_path, claimed=True, attempt=rows[-1][0], worker_id=rows[-1][1]
    )
    for number, worker, outcome in rows:
        AttemptFactory(job=job, number=number, worker_id=worker, outcome=outcome)
    context = JobContext(
        job_id=job.pk,
        task=job.task,
        attempt=run_attempt,
        max_attempts=job.max_attempts,
        worker_id=worker_ids[-1],
    )
    runner = registry.get(tasks.flaky.module_path).runner

    value = runner(context, lambda a, kw: tasks.flaky.func(*a, **kw), [], {"succeed_on": 1})
    assert value == {"attempt": run_attempt, "result_id": str(job.pk), "worker_ids": worker_ids}
    started = TaskSignal.objects.get(signal="task_started")
    assert (started.status, started.attempts, started.worker_ids) == (
        "RUNNING",
        run_attempt,
        worker_ids,
    )


# ---------------------------------------------------------------------------- the worker


@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_tasks_next_to_jobs_and_results_read_back_faithfully(
    start_worker,
) -> None:
    plain_job = echo.enqueue("a @job")
    digest = tasks.send_digest.enqueue(5)
    doubled = tasks.async_double.enqueue(21)
    flaky = tasks.flaky.enqueue()
    failing = tasks.always_fails.enqueue("nope")
    not_json = tasks.returns_a_set.enqueue()
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait() == 0, worker.output
    # A failed attempt is retried after the backoff; --burst may exit before it is due.
    while Job.objects.filter(state="pending").exists():
        assert start_worker("--burst").wait() == 0

    assert Job.objects.get(pk=plain_job.pk).state == "done"

    digest.refresh()
    assert digest.status == Status.SUCCESSFUL and digest.return_value == {"sent_to": 5}
    assert digest.enqueued_at <= digest.started_at <= digest.finished_at
    assert digest.last_attempted_at == digest.started_at
    assert digest.errors == [] and len(digest.worker_ids) == 1
    assert digest.worker_ids[0].startswith(worker.name + ":")

    assert tasks.async_double.get_result(doubled.id).return_value == 42

    flaky.refresh()
    assert flaky.status == Status.SUCCESSFUL and flaky.attempts == 2
    # The TaskContext of attempt 2 said attempt 2, and held this result's id and workers.
    assert flaky.return_value == {
        "attempt": 2,
        "result_id": flaky.id,
        "worker_ids": flaky.worker_ids,
    }
    (error,) = flaky.errors
    assert error.exception_class is ValueError
    assert "attempt 1 fails on purpose" in error.traceback
    assert 'raise ValueError(f"attempt {context.attempt} fails on purpose")' in error.traceback
    assert flaky.started_at < flaky.last_attempted_at < flaky.finished_at

    failing.refresh()
    assert failing.status == Status.FAILED and failing.attempts == 2  # OPTIONS max_attempts
    assert [e.exception_class_path for e in failing.errors] == ["builtins.ValueError"] * 2
    with pytest.raises(ValueError, match="Task failed"):
        _ = failing.return_value

    not_json.refresh()
    assert not_json.status == Status.FAILED and not_json.attempts == 1  # not retried
    assert not_json.errors[0].exception_class_path == "django_jobs.exceptions.Fail"
    assert "which is not JSON" in not_json.errors[0].traceback


@pytest.mark.django_db(transaction=True)
def test_the_worker_sends_started_and_finished_around_each_attempt(start_worker) -> None:
    flaky = tasks.flaky.enqueue()
    digest = tasks.send_digest.enqueue(1)
    failing = tasks.always_fails.enqueue()
    TaskSignal.objects.all().delete()  # the task_enqueued records
    while Job.objects.exclude(state__in=["done", "error"]).exists():
        worker = start_worker("--burst")
        assert worker.wait() == 0, worker.output

    def seen(result_id: str) -> list[tuple]:
        return list(
            TaskSignal.objects.filter(result_id=result_id).values_list(
                "signal", "status", "attempts", "errors", "sender"
            )
        )

    value_error = "builtins.ValueError"
    assert seen(flaky.id) == [
        ("task_started", "RUNNING", 1, [], BACKEND),
        ("task_finished", "READY", 1, [value_error], BACKEND),  # to be retried
        ("task_started", "RUNNING", 2, [value_error], BACKEND),
        ("task_finished", "SUCCESSFUL", 2, [value_error], BACKEND),
    ]
    assert seen(digest.id) == [
        ("task_started", "RUNNING", 1, [], BACKEND),
        ("task_finished", "SUCCESSFUL", 1, [], BACKEND),
    ]
    # FAILED only when no attempt is left (OPTIONS max_attempts is 2).
    assert seen(failing.id) == [
        ("task_started", "RUNNING", 1, [], BACKEND),
        ("task_finished", "READY", 1, [value_error], BACKEND),
        ("task_started", "RUNNING", 2, [value_error], BACKEND),
        ("task_finished", "FAILED", 2, [value_error] * 2, BACKEND),
    ]
    # Sent in the worker's executor processes, by the worker that ran each attempt.
    signals = TaskSignal.objects.filter(result_id=flaky.id)
    assert os.getpid() not in {s.pid for s in signals}
    attempts = Job.objects.get(pk=int(flaky.id)).attempts.order_by("number")
    assert [s.worker_ids[-1] for s in signals] == [
        a.worker_id for a in attempts for _ in ("started", "finished")
    ]


@pytest.mark.django_db(transaction=True)
def test_a_row_naming_a_function_that_is_not_a_task_is_never_run(start_worker) -> None:
    row = JobFactory(task=f"{tasks.__name__}.not_a_task", kwargs={"note": "ran"}, max_attempts=1)
    worker = start_worker("--burst")
    assert worker.wait() == 0, worker.output
    row.refresh_from_db()
    assert row.state == "pending" and row.attempt == 0
    assert "waiting for a worker that has registered task" in row.error
    assert not Execution.objects.filter(note="ran").exists()
