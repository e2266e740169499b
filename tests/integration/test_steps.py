"""Steps and cursors on the job database, as a run's context records and replays them: fenced on
the run's lease, checked before anything is written, kept across attempts, and gone with the job.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_jobs import Cancelled, InvalidStepResult, LeaseLost, StepError, store
from django_jobs.context import JobContext
from django_jobs.models import Job, Step
from django_jobs.operator_actions import retry
from testproject.testjobs.jobs import echo
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(job: Job, lease: str | None = None) -> JobContext:
    """A run of ``job`` (claimed with ``lease``) whose cursor saves are written at once."""
    job.refresh_from_db()
    return JobContext(
        job_id=job.pk,
        task=job.task,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        worker_id=job.worker_id or "",
        lease=lease if lease is not None else str(job.lease),
    )


def claimed(**fields: Any) -> Job:
    return JobFactory(claimed=True, lease=str(uuid.uuid4()), **fields)


def reclaim(job: Job, attempt: int | None = None) -> Job:
    """The job claimed again, by another run: a new lease, the next attempt."""
    Job.objects.filter(pk=job.pk).update(
        lease=uuid.uuid4(), attempt=attempt or job.attempt + 1, worker_id="other:1:000000"
    )
    job.refresh_from_db()
    return job


class Calls:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, value: Any) -> Any:
        self.count += 1
        return value


def test_a_step_records_its_result_once_and_a_later_attempt_gets_it_back_without_running() -> None:
    job = claimed(max_attempts=3)
    fetch = Calls()
    assert run_of(job).step("fetch", fetch, (1, 2)) == [1, 2]
    step = Step.objects.get(job_id=job.pk)
    assert (step.name, step.attempt, step.result, step.result_bytes) == ("fetch", 1, [1, 2], 5)
    again = run_of(reclaim(job))
    assert again.step("fetch", fetch, (3, 4)) == [1, 2]
    assert fetch.count == 1
    assert again.step("next", fetch, "x") == "x"
    assert fetch.count == 2
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", "attempt")) == [
        ("fetch", 1),
        ("next", 2),
    ]


def test_a_run_that_lost_its_lease_records_no_step_and_is_told() -> None:
    job = claimed()
    stale = run_of(job)
    reclaim(job)
    with pytest.raises(LeaseLost, match="lost its lease"):
        stale.step("fetch", lambda: 1)
    with pytest.raises(LeaseLost):
        stale.save_cursor("page", 3)
    assert not Step.objects.filter(job_id=job.pk).exists()
    assert Job.objects.get(pk=job.pk).cursors is None
    assert stale.is_owner() is False
    assert run_of(job).is_owner() is True


def test_a_step_name_is_used_once_per_attempt_and_steps_do_not_nest() -> None:
    job = claimed()
    run = run_of(job)
    run.step("a", lambda: 1)
    with pytest.raises(StepError, match="already run in this attempt"):
        run.step("a", lambda: 2)
    with pytest.raises(StepError, match="do not nest"):
        run.step("outer", lambda: run.step("inner", lambda: 3))
    for bad in ("", None, "x" * 201, "nul\x00"):
        with pytest.raises(StepError):
            run.step(bad, lambda: 4)  # type: ignore[arg-type]
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", flat=True)) == ["a"]


def test_a_step_whose_function_raised_may_be_tried_again_in_the_same_attempt() -> None:
    # Nothing was recorded under the name: a job that catches the error and tries the step
    # again (a transient failure) runs it, instead of being told it "was already run".
    job = claimed()
    run = run_of(job)
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("transient")
        return len(calls)

    with pytest.raises(ConnectionError):
        run.step("fetch", flaky)
    assert run.step("fetch", flaky) == 2
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", "attempt")) == [("fetch", 1)]
    with pytest.raises(StepError, match="already run in this attempt"):
        run.step("fetch", flaky)


@override_settings(JOBS_MAX_PAYLOAD_BYTES=1000)
def test_a_result_that_is_not_json_or_too_big_fails_the_step_and_records_nothing() -> None:
    job = claimed()
    run = run_of(job)
    with pytest.raises(InvalidStepResult, match="not JSON"):
        run.step("object", object)
    with pytest.raises(InvalidStepResult, match="JOBS_MAX_PAYLOAD_BYTES"):
        run.step("big", lambda: "x" * 2000)
    with pytest.raises(InvalidStepResult, match="cursor 'c'"):
        run.save_cursor("c", {1, 2})
    with pytest.raises(InvalidStepResult, match="nest"):
        deep: list = []
        for _ in range(200):
            deep = [deep]
        run.step("deep", lambda: deep)
    assert not Step.objects.filter(job_id=job.pk).exists()
    assert Job.objects.get(pk=job.pk).cursors is None


def test_text_postgresql_cannot_store_is_recorded_as_a_job_result_is() -> None:
    job = claimed(max_attempts=2)
    first = run_of(job).step("text", lambda: {"a\x00b": "lone \udc80"})
    assert first == {"a\\x00b": "lone \ufffd"}
    assert run_of(reclaim(job)).step("text", lambda: "never called") == first


def test_a_step_inside_a_transaction_of_the_job_is_refused() -> None:
    job = claimed()
    run = run_of(job)
    with transaction.atomic(), pytest.raises(StepError, match=r"transaction\.atomic"):
        run.step("in a transaction", lambda: 1)
    assert not Step.objects.filter(job_id=job.pk).exists()


def test_a_step_with_the_jobs_connection_out_of_autocommit_is_refused() -> None:
    # Autocommit turned off opens a transaction as surely as atomic() does: a step recorded in
    # it is not durable when step() returns (a rollback or a crash takes it back), and its lock
    # on the job row would hold back the job's own finish and cursor writes.
    job = claimed()
    run = run_of(job)
    transaction.set_autocommit(False)
    try:
        with pytest.raises(StepError, match="transaction"):
            run.step("in a transaction", lambda: 1)
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert not Step.objects.filter(job_id=job.pk).exists()


def test_cursors_are_kept_across_attempts_with_the_attempt_that_saved_them() -> None:
    job = claimed(max_attempts=3)
    run = run_of(job)
    assert run.cursor("page") is None
    assert run.cursor("page", 0) == 0
    run.save_cursor("page", 5)
    run.save_cursor("seen", {"ids": [1, 2]})
    assert run.cursor("page") == 5
    later = run_of(reclaim(job))
    assert later.cursor("page") == 5
    assert later.cursor("seen") == {"ids": [1, 2]}
    later.save_cursor("page", 6)
    cursors = Job.objects.get(pk=job.pk).cursors
    assert {name: (c["value"], c["attempt"]) for name, c in cursors.items()} == {
        "page": (6, 2),
        "seen": ({"ids": [1, 2]}, 1),
    }


def test_children_spawned_in_a_recorded_step_belong_to_the_job_not_the_attempt() -> None:
    job = claimed(max_attempts=3)
    run = run_of(job)
    inside = run.step("spawn", lambda: run.spawn(echo, "in the step").pk)
    outside = run.spawn(echo, "outside any step").pk
    assert Job.objects.get(pk=inside).parent_attempt is None
    assert Job.objects.get(pk=outside).parent_attempt == 1


def test_a_retry_resumes_and_a_retry_from_the_start_forgets_steps_and_cursors() -> None:
    job = claimed(max_attempts=1)
    run = run_of(job)
    run.step("a", lambda: 1)
    run.save_cursor("page", 2)
    Job.objects.filter(pk=job.pk).update(state="error", finished_at="2026-01-01T00:00Z")
    assert retry(Job.objects.filter(pk=job.pk)).changed == 1
    assert Step.objects.filter(job_id=job.pk).count() == 1
    assert Job.objects.get(pk=job.pk).cursors is not None
    Job.objects.filter(pk=job.pk).update(state="error", finished_at="2026-01-01T00:00Z")
    assert retry(Job.objects.filter(pk=job.pk), from_start=True).changed == 1
    assert not Step.objects.filter(job_id=job.pk).exists()
    assert Job.objects.get(pk=job.pk).cursors is None


def test_steps_go_with_their_job() -> None:
    job = claimed()
    run_of(job).step("a", lambda: 1)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_jobs_job WHERE id = %s", [job.pk])
    assert not Step.objects.filter(job_id=job.pk).exists()


def test_raise_if_cancelled_raises_cancelled_once_asked_and_lease_lost_for_a_stale_run() -> None:
    job = claimed()
    run = run_of(job)
    run.raise_if_cancelled()
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    with pytest.raises(Cancelled):
        run.raise_if_cancelled()
    stale = run_of(job, str(uuid.uuid4()))
    with pytest.raises(LeaseLost):
        stale.raise_if_cancelled()


def test_a_job_that_uses_no_steps_reads_no_checkpoint() -> None:
    job = claimed()
    run = run_of(job)
    run.progress(1, 2)
    assert run._run == []
    with connection.cursor() as cursor:
        assert store.checkpoint(cursor, job.pk) == store.Checkpoint()


def test_prunejobs_deletes_a_finished_jobs_steps_with_it() -> None:
    from datetime import timedelta

    from django_jobs.prune import prune

    job = claimed()
    run_of(job).step("a", lambda: 1)
    run_of(job).save_cursor("page", 1)
    kept = claimed()
    run_of(kept).step("b", lambda: 2)
    Job.objects.filter(pk=job.pk).update(state="done", finished_at="2020-01-01T00:00Z")
    prune(older_than=timedelta(days=1))
    assert not Job.objects.filter(pk=job.pk).exists()
    assert list(Step.objects.values_list("job_id", "name")) == [(kept.pk, "b")]


def test_a_stale_runs_cursor_save_does_not_undo_a_retry_from_the_start() -> None:
    # A run whose job was reaped into error (its last attempt) and then retried from the start by
    # an operator: the job is pending again, its cursors gone, and nobody has claimed it yet. The
    # stale run's lease is lost; its save must not bring a cursor back for the next run to skip
    # its work by.
    job = claimed(max_attempts=1)
    stale = run_of(job)
    stale.save_cursor("page", 2)
    Job.objects.filter(pk=job.pk).update(state="error", finished_at="2026-01-01T00:00Z")
    assert retry(Job.objects.filter(pk=job.pk), from_start=True).changed == 1
    assert stale.is_owner() is False
    with pytest.raises(LeaseLost):
        stale.save_cursor("page", 7)
    assert Job.objects.get(pk=job.pk).cursors is None
    fresh = run_of(reclaim(job))
    assert fresh.cursor("page", 0) == 0


def test_a_workers_late_cursor_write_does_not_undo_a_retry_from_the_start() -> None:
    # The same through the statement a worker's supervisor writes cursors with (record_live, not
    # fenced on the state so that a last write queued before the finish may land after it).
    job = claimed(max_attempts=1)
    lease = store.Lease(job.pk, job.attempt, job.worker_id, str(job.lease))
    Job.objects.filter(pk=job.pk).update(state="error", finished_at="2026-01-01T00:00Z")
    assert retry(Job.objects.filter(pk=job.pk), from_start=True).changed == 1
    with connection.cursor() as cursor:
        written = store.record_live(cursor, lease, None, None, cursors={"page": "7"})
    assert written.progress is False
    assert Job.objects.get(pk=job.pk).cursors is None


@override_settings(JOBS_MAX_PAYLOAD_BYTES=1000)
def test_a_jobs_cursors_together_are_bounded_and_one_too_many_changes_nothing() -> None:
    # Each value is checked against JOBS_MAX_PAYLOAD_BYTES; so must be all of them together, or a
    # job that saves a cursor per item under a name of its own grows its job row without end
    # (every cursor write rewrites them all; on a real worker, 250 cursors of 250 KB made a job
    # row of 62 MB and took its worker 50 s of writes).
    job = claimed(max_attempts=2)
    run = run_of(job)
    with pytest.raises(InvalidStepResult, match="JOBS_MAX_PAYLOAD_BYTES"):
        for n in range(100):
            run.save_cursor(f"item:{n}", "x" * 150)
    saved = Job.objects.get(pk=job.pk).cursors
    assert 0 < len(saved) < 7
    assert sum(len(c["value"]) for c in saved.values()) <= 1000
    # A later attempt, resuming with the cursors saved, is held to the same bound...
    later = run_of(reclaim(job))
    with pytest.raises(InvalidStepResult, match="JOBS_MAX_PAYLOAD_BYTES"):
        later.save_cursor("one more", "x" * 150)
    assert Job.objects.get(pk=job.pk).cursors == saved
    # ...and may still replace a cursor it has with a value of the same size.
    later.save_cursor("item:0", "y" * 150)
    assert Job.objects.get(pk=job.pk).cursors["item:0"]["value"] == "y" * 150


def test_a_step_gives_the_first_attempt_the_value_later_attempts_get_back() -> None:
    # PostgreSQL's jsonb keeps a number as a numeric and writes it out without an exponent: a
    # float of 1e16 comes back as the int 10000000000000000, and -0.0 as 0.0. The attempt that
    # records the step must get what every later attempt will.
    job = claimed(max_attempts=2)
    value = {"big": 1e16, "huge": 1.5e300, "negative zero": -0.0, "small": 2.5e-7}
    first = run_of(job).step("numbers", lambda: value)
    again = run_of(reclaim(job)).step("numbers", lambda: "never called")
    assert repr(again) == repr(first)
