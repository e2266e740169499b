"""The worker end to end: real `runjobworker` processes on the committed test database."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection

from django_jobs.models import Attempt, Job
from testproject.testjobs.jobs import (
    async_echo,
    context_job,
    echo,
    fail,
    record,
    sleep,
    unserializable,
)
from testproject.testjobs.models import Execution
from tests.conftest import ROOT, connect, wait_for
from tests.factories import JobFactory
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


def test_burst_worker_runs_jobs_and_stores_results_and_errors(start_worker) -> None:
    ok = echo.enqueue(1, "a", flag=True)
    bad = fail.enqueue("it broke")
    ctx = context_job.enqueue()
    coro = async_echo.enqueue({"x": 1})
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait() == 0, worker.output

    ok.refresh_from_db()
    assert ok.state == "done" and ok.result == {"args": [1, "a"], "kwargs": {"flag": True}}
    assert ok.worker_id.startswith(worker.name + ":")
    bad.refresh_from_db()
    assert bad.state == "error" and bad.error == "ValueError: it broke"
    attempt = bad.attempts.get()
    assert attempt.outcome == "error" and "raise ValueError(message)" in attempt.traceback
    ctx.refresh_from_db()
    assert ctx.result == {"job_id": ctx.pk, "attempt": 1, "worker_id": ctx.worker_id}
    coro.refresh_from_db()
    assert coro.state == "done" and coro.result == {"x": 1}
    assert f"job {ok.pk} done" in worker.output and f"job {bad.pk} ended error" in worker.output


def test_burst_wait_drains_retries_in_their_backoff_and_leaves_later_jobs(start_worker) -> None:
    from testproject.testjobs.jobs import retry_then_succeed

    # Plain --burst exits while the retry waits out its 1 s backoff: documented, and kept.
    first = retry_then_succeed.enqueue(succeed_on=2)
    assert start_worker("--burst").wait() == 0
    first.refresh_from_db()
    assert (first.state, first.attempt) == ("pending", 1)
    # --burst-wait drains it, and a job delayed a few seconds, but not one delayed for an hour.
    soon = echo.using(run_after=timedelta(seconds=2)).enqueue("soon")
    later = echo.using(run_after=timedelta(hours=1)).enqueue("later")
    worker = start_worker("--burst", "--burst-wait", "30")
    assert worker.wait(timeout=60) == 0, worker.output
    for job, state in [(first, "done"), (soon, "done"), (later, "pending")]:
        job.refresh_from_db()
        assert job.state == state, (job, worker.output)
    assert first.attempt == 2


def test_burst_wait_goes_with_burst_and_the_database(start_worker) -> None:
    for args, words in [
        (["--burst-wait", "5"], "--burst-wait goes with --burst"),
        (["--burst", "--burst-wait", "5", "--api", "http://127.0.0.1:1/"], "needs the database"),
        (["--burst", "--burst-wait", "0"], "must be positive"),
    ]:
        worker = start_worker(*args)
        assert worker.wait(timeout=60) != 0
        assert words in worker.output, worker.output


def test_the_alive_file_is_touched_while_the_loop_turns_and_not_when_it_stops(
    start_worker, tmp_path
) -> None:
    import os
    import signal

    alive = tmp_path / "alive"
    worker = start_worker("--alive-file", str(alive), env={"JOBS_HEARTBEAT_INTERVAL": "0.5"})
    wait_for(alive.exists)
    first = alive.stat().st_mtime
    wait_for(lambda: alive.stat().st_mtime > first + 1, timeout=30)
    os.kill(worker.proc.pid, signal.SIGSTOP)  # a frozen loop
    try:
        time.sleep(0.1)  # a touch already under way lands
        frozen = alive.stat().st_mtime
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert alive.stat().st_mtime == frozen
            time.sleep(0.2)
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    wait_for(lambda: alive.stat().st_mtime > frozen, timeout=30)


def test_unknown_tasks_wait_broken_jobs_end_in_error_and_the_worker_goes_on(start_worker) -> None:
    unknown = JobFactory(task="some.module.removed_in_last_deploy", max_attempts=1)
    broken = JobFactory(task="tests.echo", args={"not": "a list"}, max_attempts=1)
    weird_result = unserializable.enqueue()
    fine = echo.enqueue("still works")
    worker = start_worker("--burst")
    assert worker.wait() == 0, worker.output

    # A task this worker has not registered may be one a newer release's workers have: the job
    # is handed back, without counting an attempt (see test_deploys.py).
    unknown.refresh_from_db()
    assert unknown.state == "pending" and unknown.attempt == 0
    assert "waiting for a worker that has registered task 'some.module.removed_in_last_deploy'" in (
        unknown.error
    )
    broken.refresh_from_db()
    assert broken.state == "error" and "bad job arguments" in broken.error
    weird_result.refresh_from_db()
    assert weird_result.state == "error" and "not JSON" in weird_result.error
    fine.refresh_from_db()
    assert fine.state == "done"


def test_text_postgresql_cannot_store_is_made_storable_and_the_job_ends_once(start_worker) -> None:
    from testproject.testjobs.jobs import deep_result, unstorable

    nul, surrogate = unstorable.enqueue("nul"), unstorable.enqueue("surrogate")
    raised_nul, raised_surrogate = (
        unstorable.enqueue("raise_nul"),
        unstorable.enqueue("raise_surrogate"),
    )
    too_deep = deep_result.enqueue(5000)
    worker = start_worker("--burst")
    assert worker.wait() == 0, worker.output
    assert "could not record" not in worker.output and "giving up" not in worker.output
    nul.refresh_from_db()
    assert nul.state == "done" and nul.attempt == 1
    assert nul.result == {"text": "a\\x00b", "key a\\x00b": ["a\\x00b", 1]}
    assert "NUL characters written as \\x00" in nul.error
    surrogate.refresh_from_db()
    assert surrogate.state == "done" and surrogate.result["text"] == "a\ufffdb"
    for job in (raised_nul, raised_surrogate):
        job.refresh_from_db()
        assert job.state == "error" and job.attempt == 1, job.error
        assert job.error.startswith("ValueError: bad bytes: a")
        assert "[django-jobs: NUL characters written as \\x00" in job.error
        attempt = job.attempts.get()
        assert attempt.outcome == "error" and "raise ValueError" in attempt.traceback
    raised_nul.refresh_from_db()
    assert "a\\x00b" in raised_nul.error
    # A result that is not JSON at all fails for good, at the first attempt.
    too_deep.refresh_from_db()
    assert too_deep.state == "error" and too_deep.attempt == 1
    assert "not JSON: nested too deeply" in too_deep.error


def test_no_transaction_is_open_while_a_job_runs_and_queue_io_uses_at_most_two_connections(
    start_worker,
) -> None:
    jobs = [sleep.enqueue(3) for _ in range(4)]
    worker = start_worker("--concurrency", "4", "--burst")
    try:
        wait_for(lambda: Job.objects.filter(state="running").count() == 4, timeout=30)
        time.sleep(0.5)  # the scenario: a moment into the runs (3 s each), not at their claims
        with connect() as observer:
            sessions = observer.execute(
                """
                SELECT application_name, state FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                """
            ).fetchall()
            mine = [s for s in sessions if s[0].startswith(worker.name + ":")]
            idle_in_tx = [s for s in sessions if s[1] and s[1].startswith("idle in transaction")]
        assert 1 <= len(mine) <= 2, sessions
        assert idle_in_tx == [], sessions
    finally:
        assert worker.wait() == 0, worker.output
    assert {j.state for j in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {"done"}


def test_jobs_run_in_parallel_up_to_the_concurrency(start_worker) -> None:
    for _ in range(4):
        sleep.enqueue(1.5)
    worker = start_worker("--concurrency", "4", "--burst")
    assert worker.wait() == 0, worker.output
    spans = list(Attempt.objects.values_list("started_at", "finished_at"))
    latest_start = max(s for s, _ in spans)
    earliest_finish = min(f for _, f in spans)
    # All four overlapped, by the database's clock: one or two at a time, they could not have.
    assert latest_start < earliest_finish
    # From the first start to the last finish: 1.5 s, and what a busy machine adds (serially,
    # 6 s; the overlap above already refuses that on any machine).
    span = max(f for _, f in spans) - min(s for s, _ in spans)
    assert span < timedelta(seconds=1.5 + BUSY_MACHINE_MARGIN), span


def test_max_jobs_stops_after_that_many_claims(start_worker) -> None:
    echo.enqueue_many(((i,), {}) for i in range(5))
    worker = start_worker("--max-jobs", "2")
    assert worker.wait() == 0, worker.output
    assert Job.objects.filter(state="done").count() == 2
    assert Job.objects.filter(state="pending").count() == 3


def test_queues_option_limits_what_is_claimed(start_worker) -> None:
    mine = echo.using(queue="reports").enqueue()
    other = echo.using(queue="imports").enqueue()
    worker = start_worker("--queues", "reports,default", "--burst")
    assert worker.wait() == 0, worker.output
    assert Job.objects.get(pk=mine.pk).state == "done"
    assert Job.objects.get(pk=other.pk).state == "pending"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be at least 1"),
        (["--concurrency", "many"], "expected a whole number"),
        (["--queues", ","], "name at least one queue"),
        (["--grace", "-1"], "must not be negative"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_get_a_usage_error(worker_env, args, message) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "runjobworker", *args],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "usage: manage.py runjobworker" in result.stderr and message in result.stderr


@pytest.mark.slow
def test_four_workers_run_each_of_2000_jobs_exactly_once(start_worker) -> None:
    record.enqueue_many(((), {"note": str(i)}) for i in range(2000))
    started = time.monotonic()
    workers = [start_worker("--concurrency", "2", "--burst") for _ in range(4)]
    for worker in workers:
        assert worker.wait(timeout=240) == 0, worker.output
    elapsed = time.monotonic() - started

    assert Job.objects.filter(state="done").count() == 2000
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT job_id), count(DISTINCT worker_id)"
            " FROM testjobs_execution"
        )
        executions, distinct_jobs, worker_ids = cursor.fetchone()
    duplicates = executions - distinct_jobs
    print(
        f"\nexactly-once: 2000 jobs, 4 workers x 2 slots, {executions} executions, "
        f"{duplicates} duplicates, {elapsed:.1f}s"
    )
    assert (executions, distinct_jobs, duplicates) == (2000, 2000, 0)
    assert worker_ids == 4  # every worker took part
    assert not Execution.objects.filter(attempt__gt=1).exists()
