"""Long jobs you can watch, end to end: progress and captured logs through real workers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from django_jobs.models import Attempt, Job
from testproject.testjobs.jobs import chatty, progress
from tests.conftest import ROOT, connect, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def progress_writes() -> Iterator[Callable[[int], int]]:
    """The number of updates of a job row that wrote its progress, counted by a trigger: what
    the throttle promises."""
    with connect() as conn:
        conn.execute("CREATE TABLE dj_test_progress_writes (job_id bigint, done float8)")
        conn.execute(
            """
            CREATE FUNCTION dj_test_count_progress() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO dj_test_progress_writes VALUES (NEW.id, NEW.progress_done);
                RETURN NEW;
            END $$
            """
        )
        conn.execute(
            "CREATE TRIGGER dj_test_count_progress AFTER UPDATE ON django_jobs_job FOR EACH ROW"
            " WHEN (OLD.progress_updated_at IS DISTINCT FROM NEW.progress_updated_at)"
            " EXECUTE FUNCTION dj_test_count_progress()"
        )

        def count(job_id: int) -> int:
            return int(
                conn.execute(
                    "SELECT count(*) FROM dj_test_progress_writes WHERE job_id = %s", [job_id]
                ).fetchone()[0]
            )

        try:
            yield count
        finally:
            conn.execute("DROP TRIGGER dj_test_count_progress ON django_jobs_job")
            conn.execute("DROP FUNCTION dj_test_count_progress()")
            conn.execute("DROP TABLE dj_test_progress_writes")


def hot_updates() -> int:
    with connect() as conn:
        row = conn.execute(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'django_jobs_job'"
        ).fetchone()
    return int(row[0])


def test_progress_1000_times_a_second_is_written_once_per_interval_and_ends_exact(
    start_worker, progress_writes
) -> None:
    hot_before = hot_updates()
    job = progress.enqueue(3000, per_second=1000)
    worker = start_worker("--burst", env={"JOBS_PROGRESS_INTERVAL": "1"})
    assert worker.wait() == 0, worker.output

    job.refresh_from_db()
    attempt = job.attempts.get()
    seconds = (attempt.finished_at - attempt.started_at).total_seconds()
    writes = progress_writes(job.pk)
    print(f"3000 progress reports over {seconds:.2f}s made {writes} progress writes")
    # One per started interval at most, plus the last value when the attempt ended.
    assert 2 <= writes <= int(seconds) + 2
    assert job.state == "done"
    assert (job.progress_done, job.progress_total) == (3000, 3000)
    assert job.progress_message == "item 3000" and job.progress_attempt == 1
    shown = job.progress
    assert shown is not None and shown.percent == "100%" and shown.rate is not None
    # Every progress write was a HOT update (the worker's statistics are flushed at its exit).
    wait_for(lambda: hot_updates() - hot_before >= writes, timeout=10)


def test_a_retry_starts_its_progress_again_from_zero(start_worker) -> None:
    job = progress.enqueue(40, per_second=200, fail_first=True)
    worker = start_worker("--max-jobs", "2", env={"JOBS_PROGRESS_INTERVAL": "0.05"})
    assert worker.wait() == 0, worker.output
    job.refresh_from_db()
    assert job.state == "done" and job.attempt == 2
    assert job.progress_attempt == 2 and job.progress_done == 40
    first = job.attempts.get(number=1)
    assert first.outcome == "error" and "failed halfway" in first.error


def test_logs_of_a_successful_a_failed_a_timed_out_and_a_crashing_job_are_kept(
    start_worker,
) -> None:
    ok = chatty.enqueue(3)
    failed = chatty.enqueue(3, then="raise")
    crashed = chatty.enqueue(3, then="crash")
    timed_out = chatty.using(timeout=2).enqueue(3, then="hang")
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait(timeout=90) == 0, worker.output

    outcomes = {}
    for job in (ok, failed, crashed, timed_out):
        attempt = Attempt.objects.get(job=job)
        outcomes[job.pk] = attempt.outcome
        log = attempt.log
        assert "line 0\nline 1\nline 2\n" in log, (attempt.outcome, log)
        assert "WARNING testproject.chatty: a warning record" in log
        assert "INFO testproject.chatty: an info record with password=********" in log
        assert "debug record" not in log  # below JOBS_CAPTURE_LOG_LEVEL
        assert "to stderr: token=********" in log
        assert "hunter2" not in log and "abc123" not in log
        assert "django_jobs.worker" not in log  # the worker's own lines are not the job's
    assert outcomes == {
        ok.pk: "done",
        failed.pk: "error",
        crashed.pk: "crashed",
        timed_out.pk: "timeout",
    }
    # Capture changes nothing of what the job prints: it still reaches the worker's log.
    assert worker.output.count("to stderr: token=abc123") == 4
    assert worker.output.count("line 2") == 4


def test_a_job_that_prints_megabytes_keeps_its_last_64_kib(start_worker) -> None:
    job = chatty.enqueue(40_000, line_bytes=100)  # 4 MB
    worker = start_worker("--burst")
    assert worker.wait(timeout=90) == 0, worker.output
    job.refresh_from_db()
    assert job.state == "done"
    log = job.attempts.get().log
    assert log.startswith("[… ") and "earlier bytes cut: the last 65,536 are kept …]\n" in log
    assert len(log.encode()) <= 64 * 1024 + 100
    assert "line 39999." in log and "\nline 0." not in log
    assert log.rstrip().endswith("to stderr: token=********")


def test_a_running_jobs_progress_and_last_lines_can_be_watched_live(start_worker) -> None:
    job = progress.enqueue(400, per_second=100, message="row")
    worker = start_worker("--burst", env={"JOBS_PROGRESS_INTERVAL": "0.2"})

    def midway() -> Job | None:
        current = Job.objects.get(pk=job.pk)
        shown = current.progress
        return current if shown is not None and 0 < shown.done < 400 else None

    running = wait_for(midway, timeout=30)
    assert running.state == "running" and running.progress_message.startswith("row ")
    assert worker.wait() == 0, worker.output


#: ``runjobworker`` with the supervisor's masking counted (its executors are fresh interpreters,
#: started by multiprocessing's spawn, which this does not reach): the count is printed at exit.
COUNTING_SUPERVISOR = """
import atexit, sys
from django_jobs import sanitize

masked = []
real = sanitize._mask_key_values

def counting(text, keys):
    masked.append(len(text))
    return real(text, keys)

sanitize._mask_key_values = counting
atexit.register(lambda: print(f"supervisor masked {len(masked)} texts", flush=True))
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "runjobworker", *sys.argv[1:]])
"""


def test_a_worker_stores_its_jobs_output_masked_and_its_supervisor_masks_nothing(
    worker_env,
) -> None:
    # A 24 KiB line (the kind that froze the old supervisor) and secrets, through live writes.
    long_lines = chatty.enqueue(3, line_bytes=24 * 1024, pause=0.5)
    failing = chatty.enqueue(3, then="raise")
    worker = subprocess.run(
        [sys.executable, "-c", COUNTING_SUPERVISOR, "--burst", "--concurrency", "2"],
        cwd=ROOT,
        env={**worker_env, "JOBS_PROGRESS_INTERVAL": "0.1"},
        capture_output=True,
        text=True,
        timeout=90,
    )
    said = (worker.stdout + worker.stderr)[-3000:]
    assert worker.returncode == 0, said
    assert "supervisor masked 0 texts" in worker.stdout, said
    for job in (long_lines, failing):
        log = Attempt.objects.get(job=job).log
        assert "password=********" in log and "token=********" in log
        assert "hunter2" not in log and "abc123" not in log
    assert "line 2" + "." * 100 in Attempt.objects.get(job=long_lines).log
