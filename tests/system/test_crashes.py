"""A PostgreSQL server crash under running workers: ``kill -9`` of a throwaway cluster's
postmaster and its children, right after a claim or a finish was acknowledged, with the WAL
writer stopped so that anything not flushed at commit is certainly lost.

What must hold, checked from the job bodies' own journal (pids and times), not from logs:
no job runs on two executors at once; a job whose finish was acknowledged keeps its outcome and
result; no job fails and no dependent is cancelled merely because the server crashed; a step a
long job recorded is kept, and not run again.

Each scenario runs twice: with the server's ``synchronous_commit`` at its default (``on``), and
with an operator having turned it ``off`` for the whole server, which the job system's own
writes must not inherit.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import WorkerProcess, wait_for
from tests.crashable import CrashableCluster
from tests.system.helpers import Execution, executions, overlaps

pytestmark = [pytest.mark.slow, pytest.mark.crash]

DB = "jobs"
WORKER_ENV = {
    "JOBS_HEARTBEAT_INTERVAL": "1",
    "JOBS_WORKER_TIMEOUT": "60",
    "JOBS_KILL_GRACE": "1",
    "JOBS_POLL_INTERVAL": "0.2",
}


@pytest.fixture(params=["on", "off"], ids=["server-synchronous-commit-on", "server-async"])
def cluster_settings(request: pytest.FixtureRequest) -> dict[str, str]:
    return {"synchronous_commit": request.param}


@pytest.fixture
def jobs_env(cluster: CrashableCluster, worker_env: dict[str, str]) -> dict[str, str]:
    return cluster.migrated_database(DB, {**worker_env, **WORKER_ENV})


@pytest.fixture
def workers(
    jobs_env: dict[str, str], start_worker: Callable[..., WorkerProcess]
) -> Callable[..., WorkerProcess]:
    """``runjobworker`` processes on the throwaway cluster (killed at the end if still running)."""
    return lambda *args, name: start_worker(*args, name=name, env=jobs_env)


def enqueue(cluster: CrashableCluster, journal: Path, *, seconds: float, **columns: Any) -> int:
    row = {
        "task": "tests.journal",
        "kwargs": json.dumps({"path": str(journal), "seconds": seconds}),
        "max_attempts": 3,
        **columns,
    }
    names = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    sql = f"INSERT INTO django_jobs_job ({names}) VALUES ({marks}) RETURNING id"
    return int(cluster.query(sql, list(row.values()), dbname=DB)[0][0])


def job_row(cluster: CrashableCluster, job_id: int) -> dict[str, Any]:
    with cluster.connect(DB, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT state, attempt, result, error, worker_id FROM django_jobs_job WHERE id = %s",
            [job_id],
        ).fetchone()


def attempts(cluster: CrashableCluster, job_id: int) -> list[tuple[int, str]]:
    rows = cluster.query(
        "SELECT number, outcome FROM django_jobs_attempt WHERE job_id = %s ORDER BY id",
        [job_id],
        dbname=DB,
    )
    return [(number, outcome) for number, outcome in rows]


def settled(cluster: CrashableCluster, job_id: int, states: tuple[str, ...]) -> bool:
    try:
        return job_row(cluster, job_id)["state"] in states
    except psycopg.OperationalError:
        return False  # still restarting


def crash_and_restart(cluster: CrashableCluster) -> dict[str, float]:
    unwritten = cluster.unwritten_wal()
    crashed = time.monotonic()
    cluster.crash()
    cluster.start()
    return {"unwritten_wal_bytes": unwritten, "restart_s": time.monotonic() - crashed}


def report(name: str, runs: list[Execution], figures: dict[str, Any]) -> None:
    reruns = len(runs) - len({run.job for run in runs})
    print(
        f"\ncrash {name}: executions={len(runs)} reruns={reruns} "
        f"overlapping={len(overlaps(runs))} "
        + " ".join(f"{key}={value}" for key, value in figures.items())
    )


def test_a_crash_right_after_a_claim_never_runs_the_job_twice_at_once_on_one_worker(
    cluster: CrashableCluster, workers, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    cluster.stop_wal_writer()
    job = enqueue(cluster, journal, seconds=4)
    worker = workers("--concurrency", "2", name="crash-one")
    wait_for(lambda: executions(journal), timeout=60)
    figures = crash_and_restart(cluster)

    wait_for(lambda: settled(cluster, job, ("done", "error", "cancelled")), timeout=90)
    worker.signal(15)
    assert worker.wait(timeout=60) == 0, worker.output
    runs = executions(journal)
    report("after a claim, one worker with 2 slots", runs, figures)
    assert overlaps(runs) == []
    assert len(runs) == 1  # the claim survived the crash: the job was never handed out again
    row = job_row(cluster, job)
    assert row["state"] == "done" and row["result"] == {"job": job, "slept": 4}
    assert not [a for a in attempts(cluster, job) if a[1] in ("error", "lost")]


def test_a_crash_right_after_a_claim_never_runs_the_job_twice_at_once_on_two_workers(
    cluster: CrashableCluster, workers, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    first = workers("--concurrency", "1", name="crash-a")
    second = workers("--concurrency", "1", name="crash-b")
    wait_for(lambda: len(cluster.query("SELECT id FROM django_jobs_worker", dbname=DB)) == 2)
    cluster.stop_wal_writer()
    job = enqueue(cluster, journal, seconds=4)
    wait_for(lambda: executions(journal), timeout=60)
    figures = crash_and_restart(cluster)

    wait_for(lambda: settled(cluster, job, ("done", "error", "cancelled")), timeout=90)
    for worker in (first, second):
        worker.signal(15)
        assert worker.wait(timeout=60) == 0, worker.output
    runs = executions(journal)
    report("after a claim, two workers", runs, figures)
    assert overlaps(runs) == []
    assert len(runs) == 1
    row = job_row(cluster, job)
    assert row["state"] == "done" and row["result"] == {"job": job, "slept": 4}
    assert not [a for a in attempts(cluster, job) if a[1] in ("error", "lost")]


def test_a_crash_right_after_a_finish_keeps_the_outcome_and_cancels_no_dependent(
    cluster: CrashableCluster, workers, jobs_env: dict[str, str], tmp_path: Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    # The last attempt of ``upstream``; ``dependent`` also waits for ``other``, which nobody
    # serves yet, so that finishing ``upstream`` promotes nothing and writes nothing after it.
    upstream = enqueue(cluster, journal, seconds=0.5, max_attempts=1)
    other = enqueue(cluster, journal, seconds=0, queue="later")
    dependent = enqueue(cluster, journal, seconds=0, state="waiting")
    cluster.query(
        "INSERT INTO django_jobs_dependency (job_id, depends_on_id) VALUES (%s, %s), (%s, %s)",
        [dependent, upstream, dependent, other],
        dbname=DB,
    )
    cluster.stop_wal_writer()
    worker = workers("--concurrency", "1", "--queue", "default", name="crash-finish")
    wait_for(lambda: settled(cluster, upstream, ("done", "error", "cancelled")), 60, 0.002)
    figures = crash_and_restart(cluster)

    # Give the worker time to reconnect and to look for orphans at a few heartbeats.
    wait_for(lambda: cluster.query("SELECT 1 FROM django_jobs_worker", dbname=DB), timeout=60)
    time.sleep(3 * float(WORKER_ENV["JOBS_HEARTBEAT_INTERVAL"]))
    row = job_row(cluster, upstream)
    assert (row["state"], row["attempt"]) == ("done", 1)
    assert row["result"] == {"job": upstream, "slept": 0.5}
    assert attempts(cluster, upstream) == [(1, "done")]
    assert job_row(cluster, dependent)["state"] == "waiting"

    # Once its other dependency is done too, the dependent runs.
    later = workers("--burst", "--queue", "later", name="crash-later")
    assert later.wait(timeout=60) == 0, later.output
    wait_for(lambda: settled(cluster, dependent, ("done", "error", "cancelled")), timeout=60)
    worker.signal(15)
    assert worker.wait(timeout=60) == 0, worker.output
    runs = executions(journal)
    report("after a finish", runs, figures)
    assert job_row(cluster, dependent)["state"] == "done"
    assert overlaps(runs) == []
    assert [run.job for run in runs].count(upstream) == 1


# ---------------------------------------------------------------- long jobs' steps


def step_runs(path: Path) -> Counter:
    """How often each step of ``tests.five_steps`` ran, from its journal."""
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["step"] for line in path.read_text().splitlines())


def recorded_steps(cluster: CrashableCluster, job_id: int) -> list[tuple[str, int]]:
    try:
        rows = cluster.query(
            "SELECT name, attempt FROM django_jobs_step WHERE job_id = %s ORDER BY id",
            [job_id],
            dbname=DB,
        )
    except psycopg.OperationalError:
        return []  # still restarting
    return [(name, attempt) for name, attempt in rows]


def test_a_step_recorded_just_before_a_server_crash_is_kept_and_not_run_again(
    cluster: CrashableCluster, workers, tmp_path: Path
) -> None:
    path = tmp_path / "steps.jsonl"
    kwargs = json.dumps({"path": str(path), "pause": 1.5})
    ((job,),) = cluster.query(
        "INSERT INTO django_jobs_job (task, kwargs, max_attempts) VALUES (%s, %s, 5) RETURNING id",
        ["tests.five_steps", kwargs],
        dbname=DB,
    )
    worker = workers(name="crash-steps")
    wait_for(lambda: recorded_steps(cluster, job) == [("step 1", 1)], timeout=60)
    cluster.stop_wal_writer()
    cluster.crash()
    cluster.start()
    # Right after recovery, before the job could record anything more.
    assert recorded_steps(cluster, job)[:1] == [("step 1", 1)]
    wait_for(lambda: settled(cluster, job, ("done",)), timeout=120)
    worker.signal(15)
    assert worker.wait(timeout=60) == 0, worker.output
    counted = step_runs(path)
    print(f"\nstep runs across a server crash after step 1: {dict(sorted(counted.items()))}")
    assert counted[1] == 1
    assert [name for name, _ in recorded_steps(cluster, job)] == [f"step {n}" for n in range(1, 6)]
