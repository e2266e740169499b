"""Many idle worker processes: an enqueue wakes as many as the new work needs, not all of them.

Claims are counted by PostgreSQL (``track_functions = 'pl'`` counts the calls of the claim
function, ``django_jobs_claim``); see django_jobs/worker/wakeup.py for the election of the one
worker per queue set that claims on notifications.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from django_jobs.models import Attempt, Job, Worker
from testproject.testjobs.jobs import echo, sleep
from tests.conftest import WorkerProcess, connect, wait_for
from tests.timing import BUSY_MACHINE_MARGIN

# Ten workers each, and times measured: alone on the machine.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.serial]

IDLE_WORKERS = 10


@pytest.fixture
def claims() -> Callable[[], int]:
    """The number of claim statements run so far on the test database, by every session that
    has reported its statistics (a session does about once a second, and when it ends)."""
    name = connection.settings_dict["NAME"]
    with connect() as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET track_functions = pl')

    def count() -> int:
        with connect() as conn:
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
                " WHERE funcname = 'django_jobs_claim'"
            ).fetchone()
            return int(row[0])

    return count


def settled(count: Callable[[], int]) -> int:
    """The claim count once every session has reported its claims. A backend reports at most
    once a second; what it did since a report less than a second old comes only after it has
    been idle for 10 s (PostgreSQL's PGSTAT_IDLE_INTERVAL). So: once the count has not moved
    for 11 s (these tests' workers poll minutes apart)."""
    last = count()
    while True:
        time.sleep(11)
        now = count()
        if now == last:
            return now
        last = now


def backends_of(workers: list[WorkerProcess]) -> list[int]:
    """The pids of the PostgreSQL sessions of ``workers`` (named by their worker ids)."""
    with connect() as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    names = tuple(worker.name + ":" for worker in workers)
    return [pid for pid, name in rows if (name or "").startswith(names)]


def stop_and_report(workers: list[WorkerProcess]) -> None:
    """SIGTERM ``workers``, wait for them, then until each of their sessions' processes has
    exited: a session reports its statistics on its way out, so from then on the claim count
    holds every claim they made, with no wait for PostgreSQL's idle report."""
    sessions = backends_of(workers)
    for worker in workers:
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(60)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in sessions), timeout=30)


@contextmanager
def idle_workers(start_worker, count: int, *args: str) -> Iterator[list[WorkerProcess]]:
    """``count`` workers, started and idle: each listens, or waits in line to. They are stopped
    at the end (:func:`stop_and_report`)."""
    started = [start_worker(*args) for _ in range(count)]
    try:
        # Registered by their first heartbeat, then in line for the listener's place: the claims
        # of their start are over.
        wait_for(lambda: Worker.objects.count() >= count, timeout=90)
        time.sleep(2)
        yield started
    finally:
        stop_and_report(started)


def _listener() -> str | None:
    """The worker id of the listening worker: its LISTEN connection holds the advisory lock."""
    with connect() as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()"
        ).fetchone()
        return row[0] if row else None


def all_done(jobs: list[Job], timeout: float = 30) -> None:
    ids = [job.pk for job in jobs]
    wait_for(lambda: Job.objects.filter(pk__in=ids, state="done").count() == len(ids), timeout)


def test_jobs_enqueued_one_by_one_to_ten_idle_workers_cost_under_three_claims_each(
    start_worker, claims
) -> None:
    with idle_workers(start_worker, IDLE_WORKERS, "--poll-interval", "300"):
        before = settled(claims)
        jobs = []
        for n in range(40):
            jobs.append(echo.enqueue(n))
            time.sleep(0.04)
        all_done(jobs)
    spent = claims() - before
    assert Attempt.objects.filter(job_id__in=[j.pk for j in jobs]).count() == len(jobs)
    per_job = spent / len(jobs)
    assert per_job < 3, f"{spent} claims for {len(jobs)} jobs ({per_job:.1f} a job)"


def test_a_bulk_enqueue_is_spread_over_idle_workers_at_once_and_a_small_one_wakes_few(
    start_worker, claims
) -> None:
    # Polls are minutes apart: only the hand-overs can spread the burst in time, and no poll
    # comes into the claim counts.
    with idle_workers(start_worker, IDLE_WORKERS, "--poll-interval", "300"):
        # One notification for 30 jobs of 0.4 s: the listener hands over until enough run.
        burst = sleep.enqueue_many([((0.4,), {}) for _ in range(30)])
        ids = [job.pk for job in burst]
        all_done(burst, timeout=25)
        attempts = Attempt.objects.filter(job_id__in=ids)
        assert attempts.count() == 30
        workers = len(set(attempts.values_list("worker_id")))
        # By the database's clock, from their enqueue to the last one's end: spread over ten
        # workers, about 1.2 s; on one worker they would take 12 s.
        enqueued = min(job.created_at for job in Job.objects.filter(pk__in=ids))
        took = (max(attempts.values_list("finished_at", flat=True)) - enqueued).total_seconds()
        spread = 30 * 0.4 / IDLE_WORKERS
        assert workers >= 5 and took < spread + BUSY_MACHINE_MARGIN, (
            f"30 jobs on {workers} workers took {took:.1f}s"
        )

        # Three jobs in one transaction wake three workers, not ten.
        before = settled(claims)
        small = sleep.enqueue_many([((0.2,), {}) for _ in range(3)])
        all_done(small)
    spent = claims() - before
    assert spent / 3 < 3, f"{spent} claims for 3 jobs"


def test_when_the_listening_worker_is_killed_another_takes_over_at_once(
    start_worker, claims
) -> None:
    with idle_workers(start_worker, IDLE_WORKERS, "--poll-interval", "300") as workers:
        listener = wait_for(_listener)
        victim = next(w for w in workers if listener.startswith(w.name + ":"))
        victim.kill()
        victim.proc.communicate()
        time.sleep(0.2)

        before = settled(claims)
        jobs = []
        for n in range(10):
            jobs.append(echo.enqueue(n))
            time.sleep(0.04)
        all_done(jobs, timeout=20)
    spent = claims() - before
    # By the database's clock, from each job's enqueue to its start: the next in line listened
    # within milliseconds; without it, the jobs would wait for a poll, 300 s away.
    waits = [
        (started - created).total_seconds()
        for created, started in Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list(
            "created_at", "started_at"
        )
    ]
    assert max(waits) < BUSY_MACHINE_MARGIN, f"jobs started {waits} s after their enqueue"
    assert spent / len(jobs) < 3, f"{spent} claims for {len(jobs)} jobs"
