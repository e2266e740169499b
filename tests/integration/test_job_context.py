"""What a running job asks of its own row: whether to stop, and whether it may spawn a child;
each asked with the bounded waits of every statement of the job system."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import DatabaseError
from django.test import override_settings

from django_jobs.context import JobContext
from django_jobs.exceptions import SpawnRefused
from django_jobs.models import Job
from testproject.testjobs.jobs import echo
from tests.conftest import connect
from tests.factories import JobFactory
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(job: Job, lease: str | None) -> JobContext:
    return JobContext(
        job_id=job.pk,
        task=job.task,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        worker_id=job.worker_id or "",
        lease=lease,
    )


def test_a_run_stops_once_its_job_is_cancelled_or_its_lease_is_lost_or_gone() -> None:
    lease = str(uuid.uuid4())
    job = JobFactory(claimed=True, lease=lease)
    assert run_of(job, lease).is_cancelled() is False
    assert run_of(job, None).is_cancelled() is False
    assert run_of(job, str(uuid.uuid4())).is_cancelled() is True
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    assert run_of(job, lease).is_cancelled() is True
    Job.objects.filter(pk=job.pk).delete()
    assert run_of(job, lease).is_cancelled() is True
    assert run_of(job, None).is_cancelled() is False


def test_a_run_that_lost_its_lease_or_is_cancelled_spawns_nothing() -> None:
    lease = str(uuid.uuid4())
    job = JobFactory(claimed=True, lease=lease)
    child = run_of(job, lease).spawn(echo, 1)
    assert Job.objects.get(pk=child.pk).parent_id == job.pk
    with pytest.raises(SpawnRefused, match="lost its lease"):
        run_of(job, str(uuid.uuid4())).spawn(echo, 2)
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    with pytest.raises(SpawnRefused, match="being cancelled"):
        run_of(job, lease).spawn(echo, 3)
    assert Job.objects.filter(parent_id=job.pk).count() == 1


@override_settings(JOBS_LOCK_TIMEOUT_MS=300)
def test_a_lock_on_the_job_table_makes_asking_to_stop_fail_within_the_bound() -> None:
    lease = str(uuid.uuid4())
    job = JobFactory(claimed=True, lease=lease)
    holder = connect()
    holder.execute("BEGIN")
    holder.execute("LOCK TABLE django_jobs_job IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(10.0, holder.rollback)  # a wait without bound fails, not hangs
    release.start()
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="lock timeout"):
            run_of(job, lease).is_cancelled()
        # The 0.3 s lock timeout; a wait without bound would last until the release at 10 s,
        # and end without the error.
        assert time.monotonic() - started < 0.3 + BUSY_MACHINE_MARGIN
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
