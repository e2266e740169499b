"""The backend of Django's Tasks framework with a real worker: tasks run next to jobs, results and
signals read back faithfully."""

from __future__ import annotations

import os

import pytest

from django_jobs.compat import TaskResultStatus
from django_jobs.models import Job
from testproject.testjobs import tasks
from testproject.testjobs.jobs import echo
from testproject.testjobs.models import Execution, TaskSignal
from tests.factories import JobFactory

Status = TaskResultStatus
BACKEND = "django_jobs.backend.JobsBackend"

# The Tasks framework is Django's own on 6.x and the django-tasks backport on 5.2.
pytestmark = pytest.mark.django_version


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
    # Recorded as the framework's own backends record it.
    assert not_json.errors[0].exception_class_path == "builtins.TypeError"
    assert not_json.errors[0].exception_class is TypeError
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
