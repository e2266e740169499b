"""Surviving failure with real processes and real signals: reaping, fencing, timeouts, crashes,
retries, cancellation and graceful shutdown."""

from __future__ import annotations

import itertools
import signal
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import override_settings

from django_jobs import store
from django_jobs.liveness import HeartbeatLiveness
from django_jobs.models import Attempt, Job, Worker
from django_jobs.reaper import reap_pass
from testproject.testjobs.jobs import (
    ask_retry,
    crash,
    echo,
    fail_hard,
    record,
    retry_then_succeed,
    segfault,
    sleep,
    stubborn_sleep,
)
from testproject.testjobs.models import Execution
from tests.conftest import wait_for
from tests.factories import JobFactory, WorkerFactory
from tests.system.helpers import FAST_WORKER, fast_reaper, reap_once_stale
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


def running(job: Job) -> bool:
    job.refresh_from_db()
    return job.state == "running"


def test_sigkilled_worker_job_is_reaped_and_done_after_a_retry(start_worker) -> None:
    job = record.using(max_attempts=3).enqueue(note="survivor", seconds=30)
    victim = start_worker(env=FAST_WORKER)
    wait_for(lambda: running(job))
    victim.kill()
    victim.proc.wait()

    # Not at once: its last heartbeat is still fresh (judged against 60 s, not fast_reaper's
    # 2 s, which a busy machine could pass before this first pass).
    with override_settings(JOBS_WORKER_TIMEOUT=60, JOBS_HEARTBEAT_INTERVAL=0.5):
        assert reap_pass().reaped == 0
    with fast_reaper:
        report = reap_once_stale()
    assert [a.new_state for a in report.actions] == ["pending"]
    assert "no heartbeat" in report.actions[0].reason
    job.refresh_from_db()
    assert job.state == "pending" and job.attempt == 1
    lost = job.attempts.get(number=1)
    assert lost.outcome == "lost" and "worker gone" in lost.error
    assert not Worker.objects.filter(id=lost.worker_id).exists()

    Job.objects.filter(pk=job.pk).update(run_after=job.created_at, kwargs={"note": "second"})
    rescuer = start_worker("--burst", env=FAST_WORKER)
    assert rescuer.wait() == 0, rescuer.output
    job.refresh_from_db()
    assert job.state == "done" and job.attempt == 2
    assert list(job.attempts.order_by("number").values_list("outcome", flat=True)) == [
        "lost",
        "done",
    ]


def test_a_paused_worker_whose_job_was_rerun_cannot_overwrite_the_new_run(start_worker) -> None:
    job = record.using(max_attempts=3).enqueue(note="paused", seconds=2)
    paused = start_worker(env=FAST_WORKER)
    # Pause it mid-job: once the job has recorded that it started (its first statement).
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists())
    first_worker = Job.objects.get(pk=job.pk).worker_id
    paused.signal_group(signal.SIGSTOP)
    try:
        with fast_reaper:
            report = reap_once_stale()
        assert [a.new_state for a in report.actions] == ["pending"]
        Job.objects.filter(pk=job.pk).update(run_after=job.created_at)
        other = start_worker("--burst", env=FAST_WORKER)
        assert other.wait() == 0, other.output
        job.refresh_from_db()
        assert job.state == "done" and job.attempt == 2
        finished_at, second_worker = job.finished_at, job.worker_id
    finally:
        paused.signal_group(signal.SIGCONT)
    # The paused worker wakes up, its job finishes its sleep and it tries to record the result:
    # the scenario's own timing, the 2 s its run had left and some more.
    time.sleep(3)
    paused.signal(signal.SIGTERM)
    assert paused.wait() == 0, paused.output
    job.refresh_from_db()
    assert (job.state, job.attempt, job.worker_id, job.finished_at) == (
        "done",
        2,
        second_worker,
        finished_at,
    )
    assert job.attempts.get(number=1).outcome == "lost"
    assert job.attempts.get(number=2).outcome == "done"
    assert f"job {job.pk} lease lost" in paused.output
    assert first_worker != second_worker
    assert Execution.objects.filter(job_id=job.pk).count() == 2


def test_a_job_past_its_timeout_is_stopped_and_the_worker_goes_on(start_worker) -> None:
    slow = sleep.using(timeout=1, max_attempts=1).enqueue(60)
    stubborn = stubborn_sleep.using(timeout=1, max_attempts=1).enqueue(60)
    after = echo.enqueue("next")
    worker = start_worker("--burst", env=FAST_WORKER)
    assert worker.wait(timeout=60) == 0, worker.output
    for job in (slow, stubborn):
        job.refresh_from_db()
        assert job.state == "error" and "timed out after 1s" in job.error
        attempt = job.attempts.get()
        assert attempt.outcome == "timeout"
        # By the database's clock: the 1 s timeout, then SIGTERM, or SIGKILL after the 1 s kill
        # grace (FAST_WORKER) for the stubborn one; a job that was not stopped would run its 60 s.
        ran = (attempt.finished_at - attempt.started_at).total_seconds()
        assert ran < 1 + 1 + BUSY_MACHINE_MARGIN, ran
    after.refresh_from_db()
    assert after.state == "done"


def test_a_timed_out_job_gets_sigterm_first_and_sigkill_after_the_kill_grace(start_worker) -> None:
    # The supervisor's own stops still reach the job as before: a job that leaves SIGTERM alone
    # dies of it at once, and one that ignores it is killed JOBS_KILL_GRACE seconds later.
    slow = sleep.using(timeout=1, max_attempts=1).enqueue(60)
    stubborn = stubborn_sleep.using(timeout=1, max_attempts=1).enqueue(60)
    worker = start_worker(
        "--burst", "--concurrency", "2", env={**FAST_WORKER, "JOBS_KILL_GRACE": "8"}
    )
    assert worker.wait(timeout=60) == 0, worker.output
    ran = {}
    for job in (slow, stubborn):
        attempt = job.attempts.get()
        assert attempt.outcome == "timeout"
        ran[job.pk] = (attempt.finished_at - attempt.started_at).total_seconds()
    # SIGTERM stopped it at its 1 s timeout; SIGKILL after the kill grace would be 9 s.
    assert ran[slow.pk] < 1 + BUSY_MACHINE_MARGIN
    assert ran[stubborn.pk] >= 1 + 8 - 0.5  # it ignored SIGTERM: SIGKILL, after the kill grace


def test_a_timed_out_job_with_attempts_left_is_retried(start_worker) -> None:
    job = sleep.using(timeout=1, max_attempts=2).enqueue(60)
    worker = start_worker("--burst", env=FAST_WORKER)
    assert worker.wait(timeout=60) == 0, worker.output
    job.refresh_from_db()
    assert job.state == "pending" and job.attempt == 1
    assert job.run_after > job.created_at


@pytest.mark.parametrize("task", [crash, segfault], ids=["os._exit", "SIGSEGV"])
def test_a_job_that_kills_its_process_ends_crashed_and_the_worker_lives_on(
    start_worker, task
) -> None:
    doomed = task.using(max_attempts=2).enqueue()
    after = echo.enqueue("still here")
    worker = start_worker("--burst", env=FAST_WORKER)
    assert worker.wait(timeout=60) == 0, worker.output
    doomed.refresh_from_db()
    assert doomed.state == "pending" and doomed.attempt == 1  # retried: it has attempts left
    outcome = doomed.attempts.get()
    assert outcome.outcome == "crashed" and "process died" in outcome.error
    after.refresh_from_db()
    assert after.state == "done"

    Job.objects.filter(pk=doomed.pk).update(run_after=doomed.created_at)
    again = start_worker("--burst", env=FAST_WORKER)
    assert again.wait(timeout=60) == 0, again.output
    doomed.refresh_from_db()
    assert doomed.state == "error" and doomed.attempt == 2
    assert set(doomed.attempts.values_list("outcome", flat=True)) == {"crashed"}


def test_retries_wait_out_the_backoff_measured_by_the_database(start_worker) -> None:
    job = retry_then_succeed.enqueue(succeed_on=3)
    worker = start_worker(env=FAST_WORKER)  # not --burst: it stays up through the backoff
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    job.refresh_from_db()
    assert job.state == "done" and job.result == 3
    attempts = list(job.attempts.order_by("number"))
    assert [a.outcome for a in attempts] == ["error", "error", "done"]
    # The last retry's delay, as the failed attempt's finish set it (the same statement's
    # now()): the task's backoff (1, 1), jittered over 0.5-1 s. The default (5, 3600) would
    # give 5-10 s.
    delay = (job.run_after - attempts[1].finished_at).total_seconds()
    assert 0.5 <= delay <= 1.0, delay
    for failed, following in itertools.pairwise(attempts):
        # Not claimed before the delay (the database's clock); then claimed at the next poll
        # (FAST_WORKER: 0.2 s), and what a busy machine adds.
        gap = following.started_at - failed.finished_at
        assert timedelta(seconds=0.5) <= gap < timedelta(seconds=1 + BUSY_MACHINE_MARGIN), gap
    assert "attempt 1 fails on purpose" in attempts[0].error and attempts[0].traceback


def test_retry_and_fail_exceptions_steer_the_policy(start_worker) -> None:
    asked = ask_retry.enqueue(after=0.5)
    failed = fail_hard.enqueue()
    worker = start_worker("--burst", env=FAST_WORKER)
    assert worker.wait() == 0, worker.output
    failed.refresh_from_db()
    assert failed.state == "error" and failed.attempt == 1  # Fail: no retry despite 5 attempts
    asked.refresh_from_db()
    assert asked.state == "pending" and asked.error.startswith("Retry: not yet")
    wait_for(lambda: Job.objects.filter(pk=asked.pk, run_after__lte=Now()).exists(), timeout=10)
    worker = start_worker("--burst", env=FAST_WORKER)
    assert worker.wait() == 0, worker.output
    asked.refresh_from_db()
    assert asked.state == "done" and asked.result == "second time lucky"


def test_cancelling_a_pending_job_is_immediate() -> None:
    job = echo.enqueue()
    assert job.cancel() == "cancelled"
    assert job.state == "cancelled" and job.finished_at is not None
    assert job.cancel() is None  # already finished


def test_cancelling_a_running_job_stops_it_within_a_heartbeat(start_worker) -> None:
    job = sleep.using(max_attempts=3).enqueue(60)
    worker = start_worker(env=FAST_WORKER)
    wait_for(lambda: running(job))
    asked = db_now()
    assert job.cancel() == "running"
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "cancelled", timeout=10)
    attempt = job.attempts.get()
    assert attempt.outcome == "cancelled"
    # By the database's clock: the next heartbeat (FAST_WORKER: 0.5 s) carries the request, and
    # the job dies of its SIGTERM; without the request it would run its 60 s.
    assert (attempt.finished_at - asked).total_seconds() < 0.5 + BUSY_MACHINE_MARGIN
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_sigterm_lets_a_short_job_finish(start_worker) -> None:
    job = sleep.enqueue(1.5)
    worker = start_worker("--grace", "10", env=FAST_WORKER)
    wait_for(lambda: running(job))
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    job.refresh_from_db()
    assert job.state == "done"
    assert not Worker.objects.exists()  # it unregistered


def test_sigterm_releases_a_long_job_without_using_up_an_attempt(start_worker) -> None:
    job = sleep.using(max_attempts=1).enqueue(60)
    waiting = echo.enqueue("not claimed after SIGTERM")
    worker = start_worker("--grace", "1", env=FAST_WORKER)
    wait_for(lambda: running(job))
    Job.objects.filter(pk=waiting.pk).update(run_after=job.created_at)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    # --grace 1, then the job's SIGTERM (the kill grace, 1 s, at most); a worker that waited for
    # the job would wait its 60 s.
    assert time.monotonic() - started < 1 + 1 + BUSY_MACHINE_MARGIN
    job.refresh_from_db()
    assert (job.state, job.attempt, job.worker_id) == ("pending", 0, None)
    assert job.attempts.get().outcome == "released"
    assert "released" in worker.output


def test_sigterm_to_the_whole_process_group_drains_like_sigterm_to_the_supervisor(
    start_worker,
) -> None:
    # What systemd's KillMode=control-group (its default) and `kill -TERM -PGID` do: every
    # process of the worker, its executors included, gets the SIGTERM at once. The executors
    # must leave the shutdown to the supervisor: the job runs on through --grace, then is
    # released, as after a SIGTERM to the supervisor alone.
    job = sleep.using(max_attempts=1).enqueue(60)
    worker = start_worker("--grace", "2", env=FAST_WORKER)
    wait_for(lambda: running(job))
    started = time.monotonic()
    worker.signal_group(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    stopped_after = time.monotonic() - started
    job.refresh_from_db()
    assert (job.state, job.attempt, job.worker_id) == ("pending", 0, None), job.error
    assert job.attempts.get().outcome == "released"
    assert "released" in worker.output
    # The job ran on through the 2 s grace period, then was stopped (the kill grace, 1 s, at
    # most); one stopped at once would end before 2 s, one not stopped after its 60 s.
    assert 2 <= stopped_after < 2 + 1 + BUSY_MACHINE_MARGIN


def test_a_second_signal_exits_at_once(start_worker) -> None:
    job = sleep.enqueue(60)
    worker = start_worker("--grace", "60", env=FAST_WORKER)
    wait_for(lambda: running(job))
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)  # the scenario: a second signal a moment after the first, not with it
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=10) == 1
    assert running(job)  # left for the reaper


def test_a_restarted_worker_recovers_the_jobs_of_its_earlier_boot_at_once(start_worker) -> None:
    job = record.using(max_attempts=2).enqueue(seconds=60)
    first = start_worker(name="pod-a", env=FAST_WORKER)
    wait_for(lambda: running(job))
    first.kill()
    first.proc.wait()
    killed_at = db_now()
    # A worker timeout of 10 minutes: only the start-up recovery of the new boot, not a stale
    # heartbeat, can end the attempt within this test.
    second = start_worker(
        "--burst", name="pod-a", env={**FAST_WORKER, "JOBS_WORKER_TIMEOUT": "600"}
    )
    assert second.wait(timeout=90) == 0, second.output
    job.refresh_from_db()
    assert job.state == "pending" and job.attempt == 1  # waiting out its retry backoff
    lost = job.attempts.get(number=1)
    assert lost.outcome == "lost" and "worker restarted: earlier boot pod-a:" in lost.error
    assert lost.finished_at - killed_at < timedelta(seconds=90)
    assert f"reaped job {job.pk}" in second.output


def db_now():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_reaper_ignores_live_workers_and_other_states() -> None:
    alive = WorkerFactory()
    JobFactory(claimed=True, worker_id=alive.id)
    JobFactory(finished=True)
    # Seen just now: alive by a 60 s worker timeout however busy the machine (by fast_reaper's
    # 2 s, a slow moment between the factory and the pass would make it look gone).
    with override_settings(JOBS_WORKER_TIMEOUT=60, JOBS_HEARTBEAT_INTERVAL=0.5):
        assert reap_pass().actions == []


def test_reaper_recovers_a_job_overdue_past_its_timeout_even_if_its_worker_lives() -> None:
    alive = WorkerFactory()
    job = JobFactory(claimed=True, worker_id=alive.id, timeout=1, max_attempts=1)
    Job.objects.filter(pk=job.pk).update(started_at=job.created_at - timedelta(minutes=5))
    Attempt.objects.create(job=job, number=1, worker_id=alive.id)
    with override_settings(JOBS_TIMEOUT_GRACE=10):
        report = reap_pass()
    assert [(a.outcome, a.new_state) for a in report.actions] == [("timeout", "error")]
    job.refresh_from_db()
    assert job.state == "error" and "running past its timeout" in job.error


def test_reapjobs_dry_run_lists_without_changing_anything(capsys) -> None:
    job = JobFactory(claimed=True, worker_id="gone:1:000000")
    call_command("reapjobs", "--dry-run")
    out = capsys.readouterr().out
    assert f"would reap job {job.pk}" in out and "not registered" in out
    assert "1 job(s) would be reaped" in out
    assert Job.objects.get(pk=job.pk).state == "running"
    call_command("reapjobs")
    out = capsys.readouterr().out
    assert f"reaped job {job.pk}" in out and "reaped 1 job(s): 1 retried" in out


def test_heartbeat_liveness_uses_database_time() -> None:
    stale = WorkerFactory()
    Worker.objects.filter(pk=stale.pk).update(last_seen_at=stale.started_at - timedelta(minutes=5))
    JobFactory(claimed=True, worker_id=stale.id)
    from django.db import connection

    from django_jobs import store

    with connection.cursor() as cursor:
        jobs = store.running_jobs(cursor, 60)
        verdicts = HeartbeatLiveness(worker_timeout=60).dead_workers(jobs, cursor)
    assert list(verdicts) == [stale.id] and "no heartbeat for 30" in verdicts[stale.id].reason


def test_a_worker_that_cannot_heartbeat_stops_claiming() -> None:
    from django_jobs.worker.supervisor import Supervisor

    supervisor = Supervisor(install_signals=False)
    try:
        assert not supervisor._can_claim()  # never registered yet
        supervisor.heartbeats.beat()
        assert supervisor._can_claim()
        supervisor.heartbeats.last_ok -= supervisor.heartbeats.worker_timeout + 1
        assert not supervisor._can_claim()
    finally:
        supervisor.db.close()


def test_a_claim_whose_reply_never_reached_the_worker_is_released_without_using_an_attempt(
    start_worker,
) -> None:
    # A claim that committed but whose reply was lost with the connection: the job is running
    # in the table, under a worker that is alive and never heard of it. Its next heartbeat finds
    # it and hands it back without counting the attempt, so even a last attempt is not failed.
    worker = start_worker(env=FAST_WORKER)
    worker_id = wait_for(lambda: Worker.objects.values_list("id", flat=True).first())
    busy = record.enqueue(note="really running", seconds=3)
    wait_for(lambda: running(busy))
    with transaction.atomic(), connection.cursor() as cursor:
        orphan = echo.using(max_attempts=1).enqueue("never told")
        assert store.claim(cursor, worker_id, None).id == orphan.pk

    wait_for(lambda: Job.objects.get(pk=orphan.pk).state == "done", timeout=20)
    orphan.refresh_from_db()
    assert orphan.attempt == 1 and orphan.result == {"args": ["never told"], "kwargs": {}}
    released, ran = Attempt.objects.filter(job=orphan).order_by("id")
    assert (released.number, released.outcome) == (1, "released")
    assert "never got the claim" in released.error
    assert (ran.number, ran.outcome) == (1, "done")
    # The job the worker does run is left alone.
    wait_for(lambda: Job.objects.get(pk=busy.pk).state == "done", timeout=20)
    assert Attempt.objects.get(job=busy).outcome == "done"
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "releasing it without counting the attempt" in worker.output
