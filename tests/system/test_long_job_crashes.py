"""A step recorded just before a PostgreSQL server crash is still there after recovery: the
throwaway cluster's postmaster and its children are killed with ``kill -9`` right after a job
has recorded a step, with the WAL writer stopped so that anything not flushed at commit is
certainly lost, and with the server's ``synchronous_commit`` off as well as on. The job then
resumes past that step, whatever became of the attempt that recorded it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import WorkerProcess, wait_for
from tests.crashable import CrashableCluster, running_cluster

pytestmark = [pytest.mark.slow, pytest.mark.crash]

DB = "jobs"
WORKER_ENV = {
    "JOBS_HEARTBEAT_INTERVAL": "1",
    "JOBS_WORKER_TIMEOUT": "60",
    "JOBS_KILL_GRACE": "1",
    "JOBS_POLL_INTERVAL": "0.2",
}


@pytest.fixture(params=["on", "off"], ids=["server-synchronous-commit-on", "server-async"])
def cluster(request) -> Iterator[CrashableCluster]:
    with running_cluster({"synchronous_commit": request.param}) as cluster:
        yield cluster


@pytest.fixture
def workers(
    cluster: CrashableCluster,
    worker_env: dict[str, str],
    start_worker: Callable[..., WorkerProcess],
) -> Callable[..., WorkerProcess]:
    env = cluster.migrated_database(DB, {**worker_env, **WORKER_ENV})
    return lambda *args, name: start_worker(*args, name=name, env=env)


def runs(path: Path) -> Counter:
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["step"] for line in path.read_text().splitlines())


def steps(cluster: CrashableCluster, job_id: int) -> list[tuple[str, int]]:
    try:
        rows = cluster.query(
            "SELECT name, attempt FROM django_jobs_step WHERE job_id = %s ORDER BY id",
            [job_id],
            dbname=DB,
        )
    except psycopg.OperationalError:
        return []  # still restarting
    return [(name, attempt) for name, attempt in rows]


def state(cluster: CrashableCluster, job_id: int) -> str | None:
    try:
        rows = cluster.query("SELECT state FROM django_jobs_job WHERE id = %s", [job_id], dbname=DB)
    except psycopg.OperationalError:
        return None
    return rows[0][0]


def test_a_step_recorded_just_before_a_server_crash_is_kept_and_not_run_again(
    cluster: CrashableCluster, workers, tmp_path: Path
) -> None:
    path = tmp_path / "steps.jsonl"
    kwargs = json.dumps({"path": str(path), "pause": 1.5})
    (job,) = cluster.query(
        "INSERT INTO django_jobs_job (task, kwargs, max_attempts) VALUES (%s, %s, 5) RETURNING id",
        ["tests.five_steps", kwargs],
        dbname=DB,
    )[0]
    worker = workers(name="crash-steps")
    wait_for(lambda: steps(cluster, job) == [("step 1", 1)], timeout=60)
    cluster.stop_wal_writer()
    cluster.crash()
    cluster.start()
    # Right after recovery, before the job could record anything more.
    assert steps(cluster, job)[:1] == [("step 1", 1)]
    wait_for(lambda: state(cluster, job) == "done", timeout=120)
    worker.signal(15)
    assert worker.wait(timeout=60) == 0, worker.output
    counted = runs(path)
    print(f"\nstep runs across a server crash after step 1: {dict(sorted(counted.items()))}")
    assert counted[1] == 1
    assert [name for name, _ in steps(cluster, job)] == [f"step {n}" for n in range(1, 6)]
