"""Long jobs that keep their work, with real worker processes and real signals: a job of five
steps SIGKILLed in its fourth and finished by another worker, a cursor loop interrupted by
SIGKILL and by SIGTERM, a paused worker that lost its job, a cancelled loop that stops itself,
and a retry after an ordinary failure.

Each job notes every run of its work in a journal file (fsync'd, so a SIGKILL loses nothing),
and the counts come from that journal, not from logs.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from django_jobs.models import Job, Step
from testproject.testjobs.jobs import (
    async_steps,
    cancellable_loop,
    cursor_loop,
    five_steps,
    step_spawns,
)
from tests.conftest import wait_for
from tests.system.helpers import FAST_WORKER, fast_reaper, journal, reap_once_stale
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


def ready_now(job: Job) -> None:
    """Let a job that the reaper put back wait no backoff."""
    Job.objects.filter(pk=job.pk).update(run_after=job.created_at)


def test_a_job_killed_in_step_4_resumes_there_on_another_worker(start_worker, tmp_path) -> None:
    path = tmp_path / "steps.jsonl"
    job = five_steps.enqueue(str(path), pause=0.4)
    victim = start_worker(env=FAST_WORKER)
    wait_for(lambda: any(line["step"] == 4 for line in journal(path)))
    victim.kill()
    victim.proc.wait()
    with fast_reaper:
        report = reap_once_stale()
    assert [a.new_state for a in report.actions] == ["pending"]
    ready_now(job)
    rescuer = start_worker("--burst", env=FAST_WORKER)
    assert rescuer.wait() == 0, rescuer.output
    job.refresh_from_db()
    assert (job.state, job.attempt, job.result) == ("done", 2, [10, 20, 30, 40, 50])
    runs = Counter(line["step"] for line in journal(path))
    print(f"step runs after a SIGKILL in step 4: {dict(sorted(runs.items()))}")
    assert runs == {1: 1, 2: 1, 3: 1, 4: 2, 5: 1}
    recorded = dict(Step.objects.filter(job_id=job.pk).values_list("name", "attempt"))
    assert recorded == {"step 1": 1, "step 2": 1, "step 3": 1, "step 4": 2, "step 5": 2}


def test_a_rolling_deploy_releases_a_job_mid_step_and_the_new_release_resumes_it(
    start_worker, tmp_path
) -> None:
    path = tmp_path / "steps.jsonl"
    job = five_steps.enqueue(str(path), pause=0.4)
    old = start_worker("--grace", "0.2", env=FAST_WORKER)
    wait_for(lambda: any(line["step"] == 3 for line in journal(path)))
    old.signal(signal.SIGTERM)  # the old pod is told to stop; its grace runs out mid-step
    assert old.wait(timeout=30) == 0, old.output
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("pending", 0)  # released: no attempt used up
    new = start_worker("--burst", env={**FAST_WORKER, "TESTJOBS_NEW_RELEASE": "1"})
    assert new.wait() == 0, new.output
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", [10, 20, 30, 40, 50])
    assert Counter(line["step"] for line in journal(path)) == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}


def test_an_ordinary_failure_retries_from_the_failed_step(start_worker, tmp_path) -> None:
    path = tmp_path / "steps.jsonl"
    job = five_steps.enqueue(str(path), fail_in=3)
    worker = start_worker("--burst", "--burst-wait", "5", env=FAST_WORKER)
    assert worker.wait() == 0, worker.output
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("done", 2), worker.output
    assert Counter(line["step"] for line in journal(path)) == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}


def items_run(path: Path) -> Counter:
    return Counter(line["item"] for line in journal(path))


def check_cursor_loop(job: Job, path: Path, items: int) -> int:
    """That every item ran, none was skipped, and at most one ran twice; the number of repeats."""
    job.refresh_from_db()
    assert job.state == "done"
    runs = items_run(path)
    assert sorted(runs) == list(range(items))
    twice = [item for item, count in runs.items() if count > 1]
    assert all(runs[item] == 2 for item in twice)
    assert len(twice) <= 1, runs
    return len(twice)


def test_a_cursor_loop_killed_with_sigkill_resumes_after_its_last_saved_item(
    start_worker, tmp_path
) -> None:
    path = tmp_path / "items.jsonl"
    job = cursor_loop.enqueue(str(path), items=40, pause=0.1)
    victim = start_worker(env=FAST_WORKER)
    wait_for(lambda: len(journal(path)) >= 15)
    victim.kill()
    victim.proc.wait()
    with fast_reaper:
        reap_once_stale()
    ready_now(job)
    rescuer = start_worker("--burst", env=FAST_WORKER)
    assert rescuer.wait() == 0, rescuer.output
    repeats = check_cursor_loop(job, path, 40)
    print(f"cursor loop after SIGKILL: {repeats} item(s) run twice")
    assert Job.objects.get(pk=job.pk).attempt == 2


def test_a_cursor_loop_released_at_shutdown_resumes_after_its_last_item(
    start_worker, tmp_path
) -> None:
    path = tmp_path / "items.jsonl"
    job = cursor_loop.enqueue(str(path), items=40, pause=0.1)
    first = start_worker("--grace", "0.5", env=FAST_WORKER)
    wait_for(lambda: len(journal(path)) >= 15)
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0, first.output
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("pending", 0), first.output  # released, not counted
    saved = job.cursors["next"]["value"]
    assert saved == max(items_run(path)) + 1 or saved == max(items_run(path))
    second = start_worker("--burst", env=FAST_WORKER)
    assert second.wait() == 0, second.output
    repeats = check_cursor_loop(job, path, 40)
    print(f"cursor loop after SIGTERM: {repeats} item(s) run twice")


def test_a_paused_worker_that_lost_its_job_records_no_step_and_is_no_owner(
    start_worker, tmp_path
) -> None:
    path = tmp_path / "steps.jsonl"
    job = five_steps.enqueue(str(path), pause=1.0)
    paused = start_worker(env=FAST_WORKER)
    wait_for(lambda: any(line["step"] == 2 for line in journal(path)))
    paused.signal_group(signal.SIGSTOP)
    try:
        with fast_reaper:
            reap_once_stale()
        ready_now(job)
        other = start_worker("--burst", env=FAST_WORKER)
        assert other.wait() == 0, other.output
        job.refresh_from_db()
        assert (job.state, job.attempt) == ("done", 2)
        recorded = list(Step.objects.filter(job_id=job.pk).values_list("name", "attempt"))
    finally:
        paused.signal_group(signal.SIGCONT)
    # The paused run wakes in step 2 and would go on to record it and step 3: its lease is
    # lost, so nothing it records lands. Its worker notices the lost lease and stops it.
    time.sleep(2.5)
    paused.signal(signal.SIGTERM)
    assert paused.wait(timeout=30) == 0, paused.output
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", "attempt")) == recorded
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("done", 2)
    assert f"job {job.pk} lease lost" in paused.output


#: Heartbeats 30 s apart: a cancel reaches the job through raise_if_cancelled, not through a
#: heartbeat. The worker timeout is longer than that, as it must be, or the executor's fence would
#: stop the job after a second without a committed heartbeat and record the attempt lost.
NO_HEARTBEAT_SOON = {**FAST_WORKER, "JOBS_HEARTBEAT_INTERVAL": "30", "JOBS_WORKER_TIMEOUT": "120"}


def test_raise_if_cancelled_ends_a_running_job_cancelled_within_a_second(start_worker) -> None:
    job = cancellable_loop.enqueue()
    worker = start_worker(env=NO_HEARTBEAT_SOON)
    try:
        wait_for(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
        time.sleep(0.3)
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            asked = cursor.fetchone()[0]
        Job.objects.get(pk=job.pk).cancel()
        wait_for(lambda: Job.objects.filter(pk=job.pk, state="cancelled").exists(), timeout=60)
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
    job.refresh_from_db()
    attempt = job.attempts.get()
    assert attempt.outcome == "cancelled"
    # By the database's clock: the job's next check (it checks every 0.05 s), and its attempt's
    # end; a job left to its worker would stop at the next heartbeat, 30 s away.
    took = (attempt.finished_at - asked).total_seconds()
    print(f"raise_if_cancelled: cancelled {took:.2f}s after the request")
    assert took < 0.05 + BUSY_MACHINE_MARGIN
    assert job.attempt == 1  # not retried, though attempts remain


def test_a_job_that_returns_after_a_cancel_request_ends_done(start_worker) -> None:
    job = cancellable_loop.enqueue(stop="return")
    worker = start_worker(env=NO_HEARTBEAT_SOON)
    try:
        wait_for(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
        Job.objects.get(pk=job.pk).cancel()
        wait_for(lambda: Job.objects.filter(pk=job.pk, state="done").exists(), timeout=10)
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
    job.refresh_from_db()
    assert (job.result, job.cancel_requested) == ("stopped early", True)
    assert job.attempts.get().outcome == "done"


def test_children_spawned_in_a_recorded_step_are_spawned_once_across_retries(
    start_worker,
) -> None:
    job = step_spawns.enqueue()
    worker = start_worker("--burst", "--burst-wait", "5", env=FAST_WORKER)
    assert worker.wait() == 0, worker.output
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("done", 2), worker.output
    children = Job.objects.filter(parent_id=job.pk)
    assert sorted(children.values_list("state", flat=True)) == ["done", "done"]


def test_an_async_job_uses_steps_and_cursors_through_sync_to_async(start_worker) -> None:
    job = async_steps.enqueue()
    worker = start_worker("--burst", "--burst-wait", "5", env=FAST_WORKER)
    assert worker.wait() == 0, worker.output
    job.refresh_from_db()
    # Attempt 2 got attempt 1's step back, and the cursor attempt 1 saved.
    assert (job.state, job.attempt, job.result) == ("done", 2, [1, 1]), worker.output
