"""Rollups written by three workers' periodic passes at once, with a PostgreSQL crash (``kill
-9`` of a throwaway cluster, WAL writer stopped) in the middle: each hour is rolled up exactly
once, and the counts match the jobs table hour by hour."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.conftest import WorkerProcess, wait_for
from tests.crashable import CrashableCluster

pytestmark = [pytest.mark.slow, pytest.mark.crash]

DB = "jobs"
HOURS = 48
PER_HOUR = 400

FILL = f"""
WITH jobs AS (
    INSERT INTO django_jobs_job (task, queue, state, attempt, max_attempts, args, kwargs,
                                 run_after, created_at, started_at, finished_at, worker_id)
    SELECT 'tests.noop', 'q' || (g % 3), CASE WHEN g % 10 = 0 THEN 'error' ELSE 'done' END, 1,
           1, '[]', '{{}}', t - interval '3 seconds', t - interval '3 seconds',
           t - interval '1 second', t, 'w:1:abc'
    FROM generate_series(1, {HOURS * PER_HOUR}) AS g,
         LATERAL (SELECT date_trunc('hour', now()) - interval '1 hour' * (1 + g % {HOURS})
                         + interval '1 second' * (g % 3500) AS t) AS at
    RETURNING id, state, started_at, finished_at, worker_id
)
INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, finished_at, outcome)
SELECT id, 1, worker_id, started_at, finished_at, state FROM jobs
"""

PER_HOUR_COUNTS = """
SELECT date_trunc('hour', finished_at AT TIME ZONE 'UTC'), queue, state, count(*)
FROM django_jobs_job GROUP BY 1, 2, 3
"""
ROLLED = """
SELECT hour AT TIME ZONE 'UTC', queue, outcome, jobs FROM django_jobs_rollup WHERE jobs > 0
"""


def rolled_hours(cluster: CrashableCluster) -> int:
    try:
        rows = cluster.query("SELECT count(DISTINCT hour) FROM django_jobs_rollup", dbname=DB)
    except Exception:  # the server is restarting
        return -1
    return int(rows[0][0])


def test_three_workers_and_a_crash_roll_each_hour_up_once(
    cluster: CrashableCluster,
    worker_env: dict[str, str],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    env = cluster.migrated_database(
        DB,
        {
            **worker_env,
            "JOBS_ROLLUP_INTERVAL": "1",
            "JOBS_HEARTBEAT_INTERVAL": "1",
            "JOBS_POLL_INTERVAL": "0.5",
        },
    )
    cluster.query(FILL, dbname=DB)
    workers = [start_worker(name=f"roll-{i}", env=env) for i in range(3)]
    wait_for(lambda: rolled_hours(cluster) >= HOURS // 4, timeout=120)
    cluster.stop_wal_writer()
    cluster.crash()
    crashed_at = time.monotonic()
    cluster.start()
    wait_for(lambda: rolled_hours(cluster) == HOURS, timeout=180, interval=0.2)
    caught_up = time.monotonic() - crashed_at
    for worker in workers:
        worker.signal(15)
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.output

    expected = {(h, q, s): n for h, q, s, n in cluster.query(PER_HOUR_COUNTS, dbname=DB)}
    rolled = {(h, q, o): n for h, q, o, n in cluster.query(ROLLED, dbname=DB)}
    assert rolled == expected
    totals = dict(
        cluster.query(
            "SELECT outcome, sum(jobs) FROM django_jobs_rollup_total GROUP BY 1", dbname=DB
        )
    )
    assert totals == {"done": HOURS * PER_HOUR * 9 // 10, "error": HOURS * PER_HOUR // 10}
    passes = sum(w.output.count("rollups: rolled up an hour") for w in workers)
    print(
        f"\nrollups across a crash: {HOURS} hours by 3 workers, {passes} passes logged "
        f"(passes lost to the crash are rolled back and done again), caught up "
        f"{caught_up:.1f}s after the crash"
    )
