"""Leases: each claim's random token, and what a worker does when the database and its memory
disagree about which runs it holds."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from django.db import connection

from django_jobs import store
from django_jobs.context import JobContext
from django_jobs.models import Attempt, Job, Worker
from testproject.testjobs.jobs import journal
from tests.conftest import wait_for
from tests.factories import JobFactory
from tests.system.helpers import executions, overlaps

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "lease-test:1:aaaaaa"


def _roll_back_the_claim(job_id: int) -> None:
    """Undo a job's claim the way a server crash that lost its commit would, and wake workers."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_jobs_attempt WHERE job_id = %s AND outcome = 'running'", [job_id]
        )
        cursor.execute(
            """
            UPDATE django_jobs_job
            SET state = 'pending', attempt = attempt - 1, worker_id = NULL, started_at = NULL,
                lease = NULL, run_after = now()
            WHERE id = %s AND state = 'running'
            RETURNING pg_notify('django_jobs', queue)
            """,
            [job_id],
        )
        assert cursor.fetchone() is not None


def test_is_cancelled_is_true_once_the_run_has_lost_its_lease() -> None:
    JobFactory()
    with connection.cursor() as cursor:
        lease = store.claim(cursor, WORKER, None).lease
    context = JobContext(lease.job_id, "tests.noop", lease.attempt, 3, WORKER, lease=lease.token)
    assert not context.is_cancelled()
    _roll_back_the_claim(lease.job_id)
    with connection.cursor() as cursor:
        again = store.claim(cursor, WORKER, None).lease
    assert again.job_id == lease.job_id and again.attempt == lease.attempt
    assert context.is_cancelled()  # the same job and attempt number, but another run's lease
    current = JobContext(again.job_id, "tests.noop", again.attempt, 3, WORKER, lease=again.token)
    assert not current.is_cancelled()
    Job.objects.filter(pk=again.job_id).delete()
    assert current.is_cancelled()


def test_a_worker_that_claims_a_job_it_still_runs_stops_the_older_run_first(
    start_worker, tmp_path: Path
) -> None:
    # The job's claim is rolled back while it runs (as a crash that lost the claim would), and
    # the same worker, with a slot free, claims it again at once: same job, same attempt number.
    # The older run must be stopped before the newer one starts.
    path = tmp_path / "journal.jsonl"
    job = journal.using(max_attempts=3).enqueue(path=str(path), seconds=3)
    worker = start_worker(
        "--concurrency",
        "2",
        env={"JOBS_HEARTBEAT_INTERVAL": "10", "JOBS_POLL_INTERVAL": "0.2", "JOBS_KILL_GRACE": "1"},
    )
    wait_for(lambda: executions(path), timeout=30)
    _roll_back_the_claim(job.pk)

    wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    runs = executions(path)
    assert len(runs) == 2 and overlaps(runs) == []
    assert [run.ended for run in sorted(runs, key=lambda r: r.start)] == [False, True]
    assert Job.objects.get(pk=job.pk).attempt == 1
    assert "stopping the older run before starting the new one" in worker.output


def test_a_finish_that_the_database_lost_is_written_again_from_the_workers_memory(
    start_worker, tmp_path: Path
) -> None:
    # A finish that committed and was then lost (a failover to a standby that had not received
    # it): the job is running again in the table, under the worker that finished it. The
    # worker still remembers the finish until a heartbeat shows it is there, and writes it
    # again: the job keeps its outcome and result, and does not run again.
    path = tmp_path / "journal.jsonl"
    worker = start_worker(env={"JOBS_HEARTBEAT_INTERVAL": "2", "JOBS_POLL_INTERVAL": "0.2"})
    wait_for(lambda: Worker.objects.exists())
    for _ in range(5):
        job = journal.using(max_attempts=3).enqueue(path=str(path))
        wait_for(lambda job=job: Job.objects.get(pk=job.pk).state == "done", 30, 0.002)
        os.kill(worker.proc.pid, signal.SIGSTOP)  # the supervisor, not its executors
        try:
            finished = Job.objects.get(pk=job.pk)
            if Worker.objects.get().last_seen_at > finished.finished_at:
                continue  # a heartbeat came between: the worker has let go of the finish
            Attempt.objects.filter(job=finished).update(outcome="running", finished_at=None)
            Job.objects.filter(pk=job.pk).update(state="running", result=None, finished_at=None)
            break
        finally:
            os.kill(worker.proc.pid, signal.SIGCONT)
    else:
        pytest.fail("every finish was followed by a heartbeat at once")

    wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=20)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    job.refresh_from_db()
    assert (job.attempt, job.result) == (1, {"job": job.pk, "slept": 0.0})
    assert list(Attempt.objects.filter(job=job).values_list("outcome", flat=True)) == ["done"]
    assert [run.job for run in executions(path)].count(job.pk) == 1
    assert "writing it again" in worker.output
