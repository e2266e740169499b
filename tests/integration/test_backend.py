"""The backend of Django's Tasks framework: the BaseTaskBackend contract, on django-jobs."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from django_jobs import InvalidPayload
from django_jobs.compat import (
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
)
from django_jobs.context import JobContext
from django_jobs.exceptions import AttemptCrashed, AttemptLost, AttemptTimedOut
from django_jobs.models import Job
from django_jobs.registry import registry
from testproject.testjobs import tasks
from testproject.testjobs.jobs import echo
from testproject.testjobs.models import TaskSignal
from tests.conftest import connect
from tests.factories import AttemptFactory, JobFactory

Status = TaskResultStatus
BACKEND = "django_jobs.backend.JobsBackend"


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


@pytest.mark.django_db
@pytest.mark.parametrize("argument", [object(), {1, 2}, b"bytes", {"when": datetime.now()}])
def test_a_non_json_argument_raises_a_type_error_as_the_framework_does(argument) -> None:
    # Django's Tasks framework raises TypeError ("Unsupported type"); code written for it catches
    # that, and code written for django-jobs catches InvalidPayload or ValueError.
    for expected in (TypeError, ValueError, InvalidPayload):
        with pytest.raises(expected):
            tasks.add.enqueue(argument, 1)
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
