"""The supervisor's loop, driven in-process: a fake queue, fake executors, a fake clock.

No database and no process: each test runs the real loop, outbox and executor pool in
milliseconds (the scenarios with real workers and PostgreSQL are in tests/system/).
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from django_jobs.exceptions import ApiRefused
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP
from django_jobs.worker.executor import Assignment, Report
from django_jobs.worker.supervisor import Supervisor
from tests.unit.fakes import Clock, FakeExecutors, FakeQueue, succeed
from tests.unit.helpers import TASK, start, step_until, supervisor


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture
def quiet() -> Iterator[None]:
    """No log lines below errors (thousands of them would cost more than the test)."""
    logger = logging.getLogger("django_jobs")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture
def logs() -> Iterator[Records]:
    """What the worker logs, from INFO up."""
    handler = Records()
    logger = logging.getLogger("django_jobs")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_a_claimed_job_is_run_by_an_executor_and_finished(clock: Clock, logs: Records) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK)
    executors = FakeExecutors(clock)
    worker = supervisor(queue, executors, burst=True)

    assert worker.run() == 0

    assert job.state == "done"
    (assignment,) = executors.assignments
    assert (assignment.job_id, assignment.task, assignment.worker_id) == (
        job.id,
        TASK,
        worker.worker_id,
    )
    assert assignment.lease == job.token
    # The finish claims the next job in the same round trip: there is none, and --burst exits.
    assert queue.ops() == [
        ("heartbeat", None),
        ("startup recovery", None),
        ("queue limits sync", None),
        ("alert thresholds sync", None),
        ("claim", None),
        ("finish", job.id),
        ("unregister", None),
    ]
    assert worker.stats.claimed == worker.stats.done == 1
    assert f"job {job.id} done in 0.000s" in logs.messages()


def test_an_executor_whose_job_lost_its_lease_is_stopped_at_the_next_heartbeat(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK)

    def taken_away_while_running(assignment: Assignment) -> None:
        queue.take_away(assignment.job_id)  # a reaper gave the job to another worker

    executors = FakeExecutors(clock, taken_away_while_running)
    worker = supervisor(queue, executors, max_jobs=1)
    started = clock.now

    assert worker.run() == 0

    first = executors.spawned[0].process
    assert first.terminated and first.exitcode == -15
    assert worker.heartbeats.interval <= clock.now - started < worker.heartbeats.interval + 1
    assert queue.ops("finish", "release") == []  # the other run owns the job now
    assert worker.stats.lost_leases == 1
    (line,) = [m for m in logs.messages(logging.WARNING) if "lease lost" in m]
    assert line.startswith(f"job {job.id} lease lost (attempt 1): stopped: its lease was lost")
    assert len(executors.spawned) == 2  # the stopped executor was replaced


def test_a_job_past_its_timeout_is_stopped_and_its_attempt_ends_timeout(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK, timeout=30, max_attempts=1)
    executors = FakeExecutors(clock, lambda assignment: None)  # it never returns
    worker = supervisor(queue, executors, burst=True)
    started = clock.now

    assert worker.run() == 0

    assert job.state == "error" and queue.outcomes[str(job.token)] == "timeout"
    assert 30 <= clock.now - started < 31
    assert executors.spawned[0].process.terminated
    assert f"job {job.id} timed out after 30s: stopping it" in logs.messages()


def test_a_running_job_whose_cancellation_was_requested_is_stopped_at_the_next_heartbeat(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK)

    def cancelled_while_running(assignment: Assignment) -> None:
        queue.jobs[assignment.job_id].cancel_requested = True

    worker = supervisor(queue, FakeExecutors(clock, cancelled_while_running), burst=True)
    started = clock.now

    assert worker.run() == 0

    assert job.state == "cancelled" and queue.outcomes[str(job.token)] == "cancelled"
    assert worker.heartbeats.interval <= clock.now - started < worker.heartbeats.interval + 1
    assert f"job {job.id} cancellation requested: stopping it" in logs.messages()


def test_a_job_claimed_again_while_its_older_run_goes_on_starts_once_that_run_has_exited(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK)

    def reaped_while_running(assignment: Assignment) -> Report | None:
        if assignment.attempt == 1:
            queue._set(job, "pending")  # a reaper judged this worker gone, and retries the job
            return None
        return succeed(assignment)

    executors = FakeExecutors(clock, reaped_while_running)
    worker = supervisor(queue, executors, concurrency=2, burst=True)

    assert worker.run() == 0

    assert job.state == "done" and job.attempt == 2
    first, second = executors.assignments
    assert (first.attempt, second.attempt) == (1, 2)
    older = executors.spawned[0]
    assert older.process.terminated and second not in older.assignments
    # The new run started on the executor that replaced the older run's, once that had exited.
    assert second in executors.spawned[2].assignments
    warnings = logs.messages(logging.WARNING)
    assert warnings[0].startswith(f"job {job.id} claimed again (attempt 2) while attempt 1 still")
    assert warnings[1].startswith(f"job {job.id} lease lost (attempt 1): stopped")


def test_a_stopped_worker_releases_the_jobs_still_running_at_the_end_of_its_grace_period(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK)
    worker: Supervisor

    def stop_while_running(assignment: Assignment) -> None:
        worker.request_stop()  # SIGTERM

    worker = supervisor(queue, FakeExecutors(clock, stop_while_running), grace=5.0)
    started = clock.now

    assert worker.run() == 0

    assert job.state == "pending" and job.attempt == 0  # the attempt is given back
    assert 5 <= clock.now - started < 6
    assert f"job {job.id} still running at the end of the grace period: releasing it" in (
        logs.messages()
    )
    assert f"job {job.id} released for another worker" in logs.messages()


def test_a_finish_that_fails_for_a_while_is_retried_on_its_own_backoff_while_others_go_on(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    first, second = queue.add(TASK, 2)
    lock_wait = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    queue.failures["finish", first.id] = [lock_wait, lock_wait]
    worker = supervisor(queue, FakeExecutors(clock), concurrency=2, burst=True)

    assert worker.run() == 0

    assert first.state == second.state == "done"
    finishes = [(at, job_id) for at, op, job_id in queue.calls if op == "finish"]
    assert [job_id for _, job_id in finishes] == [first.id, second.id, first.id, first.id]
    tries = [at for at, job_id in finishes if job_id == first.id]
    assert 0.5 <= tries[1] - tries[0] <= 1.0  # backoff(1), with jitter
    assert 1.0 <= tries[2] - tries[1] <= 2.0  # backoff(2)
    # A lock wait is no outage: nothing else waited for it.
    assert worker.gate.outage.failures == 0 and queue.ops("heartbeat") == [("heartbeat", None)]
    complaint = f"database error during finish job {first.id} (LockNotAvailable: canceling"
    assert sum(m.startswith(complaint) for m in logs.messages(logging.WARNING)) == 2


def test_a_finish_the_api_refuses_is_not_sent_again(clock: Clock, logs: Records) -> None:
    # A 4xx would come again: the plain error is recorded at once, and if the API refuses that
    # too, the write is dropped (the heartbeat's orphans or the reaper recover the job).
    queue = FakeQueue(clock)
    first, second = queue.add(TASK, 2)
    refusal = ApiRefused("the jobs API refused v1/jobs/1/finish (400): bad", 400)
    queue.failures["finish", first.id] = [refusal, refusal]
    worker = supervisor(queue, FakeExecutors(clock), concurrency=2, burst=True)

    worker.run()

    assert second.state == "done"
    assert [op for _, op, job_id in queue.calls if op == "finish" and job_id == first.id] == [
        "finish",
        "finish",
    ]
    assert first.state == "running" and not worker.outbox.writes
    assert any(m.startswith(f"giving up on finish job {first.id}") for m in logs.messages())


def test_ending_thousands_of_jobs_of_a_task_no_worker_has_does_not_recurse(
    clock: Clock, quiet: None
) -> None:
    # Each job's end in error claims the next one in its round trip, which is handed back,
    # which ends it in error, ...: writes queued while the outbox flushes wait for the next
    # flush, so the stack stays as deep as for one job.
    queue = FakeQueue(clock)
    jobs = queue.add("unit.gone", 5000)
    queue.expired_tasks = {"unit.gone"}
    depths: list[int] = []
    queue.on_hand_back = lambda: depths.append(stack_depth())
    worker = supervisor(queue, FakeExecutors(clock), burst=True)

    assert worker.run() == 0

    assert {job.state for job in jobs} == {"error"}
    assert len(depths) == 5000 and max(depths) - min(depths) <= 10
    assert worker.stats.failed == 5000 and worker.stats.claimed == 0


def test_thousands_of_handed_back_jobs_make_one_log_line_a_minute(
    clock: Clock, logs: Records, settings: Any
) -> None:
    settings.JOBS_UNKNOWN_TASK_DELAY = 0  # claim the task's jobs again at once
    queue = FakeQueue(clock)
    jobs = queue.add("unit.new_release", 1000)
    queue.run_elsewhere = True  # a worker of the new release runs each one handed back
    depths: list[int] = []
    queue.on_hand_back = lambda: depths.append(stack_depth())
    worker = supervisor(queue, FakeExecutors(clock), burst=True)
    started = clock.now

    assert worker.run() == 0

    assert {job.state for job in jobs} == {"done"} and {job.attempt for job in jobs} == {0}
    assert max(depths) - min(depths) <= 10
    minutes = int((clock.now - started) // 60) + 1
    lines = [m for m in logs.messages(logging.WARNING) if m.startswith("handed back")]
    assert 1 <= len(lines) <= minutes
    assert lines[0].startswith("handed back 1 job(s) of task 'unit.new_release'")


def test_a_worker_started_while_its_database_is_away_logs_a_line_a_minute_then_serves_jobs(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    (job,) = queue.add(TASK)
    queue.down_until = clock.now + 150
    worker = supervisor(queue, FakeExecutors(clock), burst=True)

    assert worker.run() == 0

    assert job.state == "done"
    warnings = logs.messages(logging.WARNING)
    assert 2 <= len(warnings) <= 3  # at once, then once a minute
    assert all("connection refused" in line for line in warnings)
    assert "more failed tries since the last report" in warnings[1]
    assert any(m.startswith("database reachable again after") for m in logs.messages())
    tries = [at for at, _, _ in queue.calls]
    assert max(b - a for a, b in itertools.pairwise(tries)) <= OUTAGE_RETRY_CAP
    assert min(at for at in tries if at >= queue.down_until) - queue.down_until <= OUTAGE_RETRY_CAP


def test_a_finish_the_database_lost_is_written_again_and_an_orphan_is_released(
    clock: Clock, logs: Records
) -> None:
    queue = FakeQueue(clock)
    finished, orphan = queue.add(TASK, 2)
    worker = supervisor(queue, FakeExecutors(clock), max_jobs=1)
    start(worker)
    step_until(worker, lambda: finished.state == "done")
    # A failover to a standby that had neither the finish, nor the reply of a second claim.
    token = finished.token
    queue._set(finished, "running")
    finished.worker_id, finished.token = worker.worker_id, token
    queue._set(orphan, "running", 1)
    orphan.worker_id, orphan.token = worker.worker_id, "lost-reply"

    worker.heartbeats.beat()

    assert finished.state == "done" and queue.ops("finish")[-1] == ("finish", finished.id)
    assert orphan.state == "pending" and orphan.attempt == 0
    warnings = logs.messages(logging.WARNING)
    assert f"job {finished.id}: the database lost its recorded outcome" in warnings[0]
    assert f"job {orphan.id} is running under this worker in the database" in warnings[1]
    assert f"job {orphan.id} released for another worker" in logs.messages()


def test_an_idle_worker_long_polls_until_its_next_heartbeat_and_not_while_a_job_runs(
    clock: Clock, settings
) -> None:
    settings.JOBS_ROLLUP_INTERVAL = 0  # no rollup pass due before the heartbeat
    settings.JOBS_EXPIRY_INTERVAL = 0  # nor an expiry pass
    queue = FakeQueue(clock)
    executors = FakeExecutors(clock)
    worker = supervisor(queue, executors, concurrency=2, long_poll=30.0)
    start(worker)

    step_until(worker, lambda: queue.waits)
    (claimed_at,) = [at for at, op, _ in queue.calls if op == "claim"]
    assert queue.waits == [pytest.approx(worker.heartbeats.next_at - claimed_at)]  # not 30
    assert 0 < queue.waits[0] <= worker.heartbeats.interval

    # The wait was the poll: the next claim comes at once. It takes a job; while that runs, a
    # claim for the free slot does not wait (the loop must serve the executor).
    (job,) = queue.add(TASK)
    worker._step()
    assert queue.waits[1] > 0 and queue.waits[2:] == [0.0]
    assert job.state == "done"


def test_a_worker_with_no_long_poll_claims_without_waiting(clock: Clock) -> None:
    queue = FakeQueue(clock)
    worker = supervisor(queue, FakeExecutors(clock))
    start(worker)
    step_until(worker, lambda: queue.waits)
    assert queue.waits == [0.0]


def test_a_worker_looks_for_an_hour_to_roll_up_each_interval_and_a_failing_look_holds_back_nothing(
    clock: Clock, logs: Records, settings
) -> None:
    settings.JOBS_ROLLUP_INTERVAL = 60
    queue = FakeQueue(clock)
    lock_wait = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    queue.failures["rollups", None] = [lock_wait, lock_wait]
    jobs = queue.add(TASK, 2)
    worker = supervisor(queue, FakeExecutors(clock))
    start(worker)
    began = clock.now
    while clock.now < began + 400:
        worker._step()
        clock.advance_to(min(worker._next_timeout() + clock.now, clock.now + 5))
    looks = [at - began for at, op, _ in queue.calls if op == "rollups"]
    # The first look within 5 s of the start; two failures on their own backoff (seconds);
    # then one look a minute or so.
    assert looks[0] <= 5.0
    assert looks[2] - looks[0] < 10
    assert 4 <= len(looks) <= 3 + 400 / 48
    gaps = [b - a for a, b in itertools.pairwise(looks[2:])]
    assert all(48 <= gap <= 72 + 5 for gap in gaps), gaps
    assert [job.state for job in jobs] == ["done", "done"]
    assert worker.gate.outage.failures == 0
