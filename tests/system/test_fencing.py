"""Executors that cannot outlive their supervisor, nor run on while it is stalled: the fence
(a job is stopped before the reaper could judge its worker gone) and the parent-death signal
(no executor outlives a supervisor killed by any signal)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_jobs.models import Attempt, Job, Worker
from django_jobs.reaper import reap_pass
from django_jobs.worker.fence import FENCE_SLACK
from testproject.testjobs.jobs import hold_gil, journal
from tests.conftest import wait_for
from tests.skips import NOT_ON_THIS_MACHINE
from tests.system.helpers import FAST_WORKER, Execution, executions
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


def children_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid``, read from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            # The command name may hold spaces and parentheses: the fields follow the last ")".
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    return "?"


@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(),
    reason=NOT_ON_THIS_MACHINE + "/proc, which it reads (Linux)",
)
def test_no_executor_outlives_a_supervisor_killed_by_sigkill(start_worker, tmp_path: Path) -> None:
    # Three slots: one busy with a long job, two idle. Only the main pid is killed, so nothing
    # but the executors themselves can notice that their supervisor is gone.
    path = tmp_path / "journal.jsonl"
    job = journal.enqueue(path=str(path), seconds=60)
    worker = start_worker("--concurrency", "3", env={"JOBS_POLL_INTERVAL": "0.2"})
    wait_for(lambda: path.exists() and Job.objects.get(pk=job.pk).state == "running", 60)
    wait_for(lambda: len(children_of(worker.proc.pid)) >= 3, 30)
    executors = children_of(worker.proc.pid)

    os.kill(worker.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    worker.proc.wait()  # not communicate(): the executors hold copies of its stdout
    # The kernel kills them with their parent (PR_SET_PDEATHSIG): at once, and what a busy
    # machine adds to seeing it; an executor that outlived it would never die.
    deadline = BUSY_MACHINE_MARGIN
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not any(alive(pid) for pid in executors), timeout=deadline, interval=0.05)
    waited = time.monotonic() - killed_at
    survivors = {pid: command_line(pid) for pid in executors if alive(pid)}
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert survivors == {}, f"{len(survivors)} of {len(executors)} outlived the worker"
    assert waited < deadline


#: A worker that beats every 0.5 s and counts as gone after 10 s of silence: its executors stop
#: their job 10 - 0.5 (JOBS_KILL_GRACE) - 2 (FENCE_SLACK) = 7.5 s after its last heartbeat.
FAST = {**FAST_WORKER, "JOBS_WORKER_TIMEOUT": "10", "JOBS_KILL_GRACE": "0.5"}


def overlapping(runs: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of runs, of any job, that were alive at the same time."""
    return [
        (a, b)
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
        if a.start <= b.last and b.start <= a.last
    ]


@pytest.mark.slow
def test_a_stalled_supervisors_job_stops_before_another_worker_runs_it_again(
    start_worker, tmp_path: Path
) -> None:
    # Two jobs under concurrency_limit=1. The first runs on a worker whose supervisor is then
    # stopped (SIGSTOP: its executor is not). The reaper gives the job to a second worker once
    # the first has been silent for JOBS_WORKER_TIMEOUT; by then the first run must be dead, or
    # two bodies would run at once under a limit of 1. The bodies' own journal is the judge.
    path = tmp_path / "journal.jsonl"
    limited = journal.using(max_attempts=3, concurrency_key="fence", concurrency_limit=1)
    first = limited.enqueue(path=str(path), seconds=12)
    stalled = start_worker(env=FAST)
    wait_for(lambda: executions(path), 60)
    second = limited.enqueue(path=str(path), seconds=1)
    os.kill(stalled.proc.pid, signal.SIGSTOP)  # the supervisor only
    stopped_at = time.monotonic()
    try:
        taker = start_worker(env=FAST)
        with override_settings(JOBS_WORKER_TIMEOUT=10, JOBS_HEARTBEAT_INTERVAL=0.5):
            wait_for(lambda: reap_pass().actions, timeout=30, interval=0.2)
        done = {"done"}
        wait_for(lambda: set(Job.objects.values_list("state", flat=True)) == done, 60, 0.2)
    finally:
        stalled_for = time.monotonic() - stopped_at
        os.kill(stalled.proc.pid, signal.SIGCONT)
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            resumed = cursor.fetchone()[0]

    runs = sorted(executions(path), key=lambda run: run.start)
    assert overlapping(runs) == [], runs
    assert [(run.job, run.ended) for run in runs] == [
        (first.pk, False),  # stopped by its own executor
        (first.pk, True),
        (second.pk, True),
    ] or [(run.job, run.ended) for run in runs] == [
        (first.pk, False),
        (second.pk, True),
        (first.pk, True),
    ]
    assert runs[0].last - runs[0].start < stalled_for
    print(
        f"the stalled run was last seen {runs[1].start - runs[0].last:.2f}s before the next body"
        f" started; overlap 0 of {len(runs)} bodies"
    )

    # The stalled supervisor, back, finds its job stopped, says so, and overwrites nothing.
    back = Worker.objects.filter(id__startswith=stalled.name + ":", last_seen_at__gt=resumed)
    wait_for(back.exists, 30)
    stalled.signal(signal.SIGTERM)
    taker.signal(signal.SIGTERM)
    assert stalled.wait(60) == 0, stalled.output
    assert taker.wait(60) == 0, taker.output
    assert f"job {first.pk} was stopped by its own executor" in stalled.output, stalled.output
    assert f"job {first.pk} lease lost" in stalled.output, stalled.output
    first.refresh_from_db()
    assert (first.state, first.attempt, first.result) == (
        "done",
        2,
        {"job": first.pk, "slept": 12},
    )
    outcomes = (
        Attempt.objects.filter(job=first).order_by("number").values_list("outcome", flat=True)
    )
    assert list(outcomes) == ["lost", "done"]


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(),
    reason=NOT_ON_THIS_MACHINE + "/proc, which it reads (Linux)",
)
def test_a_job_holding_the_gil_is_killed_by_the_kernel_before_the_worker_timeout(
    start_worker,
) -> None:
    # The job backtracks in the regex engine, so its executor's watchdog thread never runs:
    # the kernel timer it armed must kill the process in its place.
    job = hold_gil.enqueue()
    worker = start_worker(env=FAST)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", 60)
    wait_for(lambda: children_of(worker.proc.pid), 30)
    time.sleep(0.5)  # the job is in the regex by now, and has been beating all the while
    executors = [pid for pid in children_of(worker.proc.pid) if "spawn_main" in command_line(pid)]
    assert len(executors) == 1, executors
    watched = os.pidfd_open(executors[0])  # readable once the process has died
    os.kill(worker.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # Dead by JOBS_WORKER_TIMEOUT (10 s) less FENCE_SLACK (2 s) after the last heartbeat.
        assert select.select([watched], [], [], 15)[0], "the GIL-holding job is still alive"
        dead_after = time.monotonic() - stopped_at
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM clock_timestamp() - last_seen_at)"
                " FROM django_jobs_worker WHERE id LIKE %s",
                [worker.name + ":%"],
            )
            (silent_for,) = [float(row[0]) for row in cursor.fetchall()]
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
        os.close(watched)
    print(
        f"the GIL-holding job died {dead_after:.2f}s after its supervisor was stopped,"
        f" {silent_for:.2f}s after its last heartbeat by the database's clock"
    )
    # The kernel's timer kills it FENCE_SLACK before JOBS_WORKER_TIMEOUT (10 - 2 s) after the
    # heartbeat the job saw last, which came at least 0.5 s before the stop: by 7.5 s. A timer
    # without the slack would kill it 9-9.5 s after the stop. The bound leaves 1 s to see it
    # dead (its pidfd wakes this process at its death: no polling).
    assert dead_after < 10 - FENCE_SLACK + 0.5, (dead_after, silent_for)
    # As the reaper judges a worker, by the database's clock: dead before its worker had been
    # silent for the worker timeout.
    assert silent_for < 10, (dead_after, silent_for)
