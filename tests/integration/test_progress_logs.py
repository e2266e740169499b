"""Progress and captured logs in the database and the admin: the fenced, HOT write, the
``django_jobs_running`` view, ``jobstats``, and the job list and page."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection, transaction

from django_jobs import sanitize, stats, store
from django_jobs.log_tail import stored_log
from django_jobs.models import Attempt, Job
from django_jobs.progress import checked
from django_jobs.store import Lease
from tests.factories import AttemptFactory, JobFactory
from tests.timing import CPU_BOUND

pytestmark = pytest.mark.django_db


def running_job(**fields: object) -> tuple[Job, Lease]:
    token = str(uuid.uuid4())
    job = JobFactory(claimed=True, worker_id="pod-a:1:aaaaaa", lease=token, **fields)
    AttemptFactory(job=job, number=job.attempt, worker_id=job.worker_id, lease=token)
    return job, Lease(job.pk, job.attempt, job.worker_id, token)


def record(lease: Lease, done: float, total: float | None = None, log: str | None = None) -> bool:
    with connection.cursor() as cursor:
        written = store.record_live(
            cursor, lease, checked(lease.job_id, done, total, f"at {done}"), log
        )
    return written.progress


def test_progress_writes_are_hot_updates() -> None:
    _, lease = running_job()
    hot = "SELECT pg_stat_get_xact_tuples_hot_updated('django_jobs_job'::regclass)"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(hot)
        before = cursor.fetchone()[0]
        for done in range(1, 6):
            assert record(lease, done, 10, log=f"line {done}\n")
        cursor.execute(hot)
        assert cursor.fetchone()[0] - before == 5


def test_progress_writes_are_fenced_by_the_lease() -> None:
    job, lease = running_job()
    stale = Lease(job.pk, job.attempt, job.worker_id, str(uuid.uuid4()))
    assert not record(stale, 5, 10, log="from a run that lost its lease")
    assert record(lease, 7, 10, log="mine")
    job.refresh_from_db()
    assert (job.progress_done, job.progress_total, job.progress_message) == (7, 10, "at 7")
    assert job.attempts.get().log == "mine"


def test_a_new_attempt_shows_no_progress_of_the_last_one() -> None:
    job, lease = running_job(attempt=1)
    record(lease, 9, 10)
    job.refresh_from_db()
    assert job.progress is not None and job.progress.percent == "90%"
    Job.objects.filter(pk=job.pk).update(attempt=2)
    job.refresh_from_db()
    assert job.progress is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT progress_done FROM django_jobs_running WHERE job_id = %s", [job.pk])
        assert cursor.fetchone() == (None,)


def test_the_running_view_and_jobstats_show_progress_rate_and_time_left() -> None:
    job, lease = running_job(task="tests.progress")
    record(lease, 25, 100)
    (row,) = [r for r in stats.running() if r["job_id"] == job.pk]
    assert row["progress_done"] == 25 and row["progress_percent"] == 25
    assert row["progress_message"] == "at 25" and row["progress_updated_at"] is not None
    summary = stats.summary()
    assert [r["job_id"] for r in summary["running"]] == [job.pk]
    text = stats.render(summary)
    assert "progress · 1 running job(s)" in text and "25/100" in text and "25%" in text


def test_the_job_list_shows_a_bar_and_the_job_page_the_details_and_logs(admin_client) -> None:
    job, lease = running_job(task="tests.progress")
    # As a worker stores it: masked where it was written (worker/capture.py, log_tail.py).
    record(lease, 3, 4, log=stored_log("step one\nlogin with password=hunter2\n", 1024))
    listing = admin_client.get("/admin/django_jobs/job/").content.decode()
    assert 'class="dj-progress"' in listing and "75%" in listing
    page = admin_client.get(f"/admin/django_jobs/job/{job.pk}/change/").content.decode()
    assert "3 of 4" in page and "at 3" in page and "(attempt 1)" in page
    assert 'id="dj-live-log"' in page and "last 2 of 2 lines" in page and "step one" in page
    assert "hunter2" not in page and "password=********" in page


#: 24 KiB of hex on one line, then lines that make masking work: what froze the old admin.
ADVERSARIAL_LOG = (
    "0123456789abcdef" * 1536 + "\n" + "password" * 64 + "\n" + "token" + ":" * 2000 + "\n"
)


@pytest.mark.parametrize("outcome", ["error", "running"])
def test_the_job_page_shows_a_large_stored_log_quickly_without_masking_it_again(
    admin_client, monkeypatch, outcome: str
) -> None:
    job, _ = running_job()
    stored = stored_log(ADVERSARIAL_LOG, 64 * 1024)
    Attempt.objects.filter(job=job).update(outcome=outcome, log=stored)
    masked: list[int] = []
    real = sanitize._mask_key_values

    def counting(text: str, keys: tuple[str, ...]) -> str:
        masked.append(len(text))
        return real(text, keys)

    monkeypatch.setattr(sanitize, "_mask_key_values", counting)
    started = time.thread_time()  # CPU time: other processes on the cores do not add to it
    page = admin_client.get(f"/admin/django_jobs/job/{job.pk}/change/")
    elapsed = time.thread_time() - started
    assert page.status_code == 200 and "0123456789abcdef" * 64 in page.content.decode()
    # What the page masks (the job's payloads, its error) is short: never the stored log.
    assert all(length < 2_000 for length in masked), masked
    assert elapsed < CPU_BOUND  # tens of milliseconds; the old quadratic masking took 29 s
