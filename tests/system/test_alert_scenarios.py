"""Each alert of ``django_jobs_alerts`` in a real scenario with real worker processes: it fires
while the trouble lasts and clears when the cause is gone. The thresholds are short (a second
or two, from ``JOBS_ALERTS`` in the workers' environment, written by the worker at its start);
each test prints how long the alert took to fire and to clear."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_jobs.models import Job, Schedule
from django_jobs.schedules import ticks
from testproject.testjobs.jobs import echo, sleep
from tests.conftest import WorkerProcess, connect, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ALERTS = {
    "schedule_grace": 1,
    "queue_age": 2,
    "no_worker": 1,
    "expected_duration": {"tests.sleep": 1},
}
ENV = {
    "JOBS_ALERTS": json.dumps(ALERTS),
    "JOBS_HEARTBEAT_INTERVAL": "0.5",
    "JOBS_WORKER_TIMEOUT": "3",
    "JOBS_POLL_INTERVAL": "0.2",
    "JOBS_SCHEDULER_INTERVAL": "0.5",
}


def firing(kind: str) -> dict[str, dict[str, Any]]:
    """The rows of ``kind`` firing now, by subject (read on a connection of its own, which judges
    workers by the workers' own timeout, as ``ALTER DATABASE ... SET django_jobs.worker_timeout``
    would make every session do)."""
    with connect() as conn:
        conn.execute(f"SET django_jobs.worker_timeout = {ENV['JOBS_WORKER_TIMEOUT']}")
        rows = conn.execute(
            "SELECT subject, severity, detail FROM django_jobs_alerts WHERE kind = %s", [kind]
        ).fetchall()
    return {subject: {"severity": severity, "detail": detail} for subject, severity, detail in rows}


def thresholds_written() -> bool:
    with connect() as conn:
        row = conn.execute(
            "SELECT value FROM django_jobs_alert_threshold "
            "WHERE kind = 'schedule_grace' AND subject = '*'"
        ).fetchone()
    return row is not None and row[0] == 1


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def timed(condition: Callable[[], Any], timeout: float = 60) -> float:
    started = time.monotonic()
    wait_for(condition, timeout=timeout, interval=0.05)
    return time.monotonic() - started


@pytest.fixture
def worker(start_worker: Callable[..., WorkerProcess]) -> Callable[..., WorkerProcess]:
    def start(*args: str) -> WorkerProcess:
        started = start_worker(*args, env=ENV)
        wait_for(thresholds_written, timeout=30)
        return started

    return start


def stop(*workers: WorkerProcess) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=60) == 0, w.output


def test_a_failing_schedule_fires_until_a_run_succeeds(worker, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("yes")
    flaky = Schedule.objects.create(
        name="flaky", task="tests.fail_while", cron="0 3 * * *", kwargs={"path": str(broken)},
        next_run_at=timezone.now(),
    )  # fmt: skip
    w = worker()
    fire = timed(lambda: "flaky" in firing("schedule_missed"))
    assert "no successful run yet" in firing("schedule_missed")["flaky"]["detail"]

    broken.unlink()  # fixed: the operator runs it again
    ticks.run_now(flaky.pk)
    clear = timed(lambda: "flaky" not in firing("schedule_missed"))
    stop(w)
    print(f"\nschedule_missed: fired {fire:.1f}s after the worker started, cleared {clear:.1f}s "
          "after the run that succeeded was enqueued")  # fmt: skip


def test_an_overdue_job_fires_while_it_runs_and_clears_when_it_ends(worker) -> None:
    w = worker()
    job = sleep.enqueue(seconds=4)
    started = time.monotonic()
    fire = timed(lambda: str(job.pk) in firing("job_overdue"))
    assert (
        "expected at most 1 s (its expected_duration)"
        in firing("job_overdue")[str(job.pk)]["detail"]
    )
    clear = timed(lambda: str(job.pk) not in firing("job_overdue"))
    ran = time.monotonic() - started
    assert state(job) == "done"
    stop(w)
    print(f"\njob_overdue (expected 1 s, runs 4 s): fired {fire:.1f}s after the enqueue, "
          f"cleared {clear:.1f}s later ({ran:.1f}s in), as the job ended")  # fmt: skip


def test_a_starved_queue_fires_while_its_worker_is_stopped(worker) -> None:
    w = worker("--queue", "reports")
    first = echo.using(queue="reports").enqueue("warm-up")
    wait_for(lambda: state(first) == "done", timeout=30)
    w.signal_group(signal.SIGSTOP)  # stalled: no claims, no heartbeats
    stopped = time.monotonic()
    for i in range(3):
        echo.using(queue="reports").enqueue(i)
    fire = timed(lambda: "reports" in firing("queue_age"))
    timed(lambda: "reports" in firing("queue_no_worker"))
    no_worker = time.monotonic() - stopped
    w.signal_group(signal.SIGCONT)
    clear = timed(lambda: not firing("queue_age") and not firing("queue_no_worker"))
    stop(w)
    print(f"\nqueue_age (threshold 2 s): fired {fire:.1f}s after the worker was stopped, "
          f"queue_no_worker (worker timeout 3 s, grace 1 s) {no_worker:.1f}s after; both "
          f"cleared {clear:.1f}s after the worker resumed")  # fmt: skip


def test_a_queue_without_a_worker_fires_until_one_serves_it(worker) -> None:
    serving_default = worker("--queue", "default")
    job = echo.using(queue="imports").enqueue("nobody runs me")
    fire = timed(lambda: "imports" in firing("queue_no_worker"))
    assert firing("queue_no_worker")["imports"]["severity"] == "critical"
    started = time.monotonic()
    serving_imports = worker("--queue", "imports")
    clear = timed(lambda: "imports" not in firing("queue_no_worker"))
    wait_for(lambda: state(job) == "done", timeout=30)
    stop(serving_default, serving_imports)
    print(f"\nqueue_no_worker (grace 1 s): fired {fire:.1f}s after the enqueue, cleared "
          f"{time.monotonic() - started:.1f}s after a worker for the queue was started "
          f"({clear:.1f}s after it had written its thresholds)")  # fmt: skip
