"""Slow scenarios: a PostgreSQL restart under load, and a chaos run of killed workers."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_jobs.models import Job
from testproject.testjobs.jobs import record
from tests.conftest import ROOT, wait_for
from tests.skips import not_on_this_machine
from tests.system.helpers import FAST_WORKER

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def throwaway_postgres(tmp_path_factory):
    """A PostgreSQL cluster of this test's own, so restarting it leaves the shared one alone."""
    try:
        import pgserver
    except ImportError:
        not_on_this_machine("pgserver, which ships for Python 3.11 and 3.12 only")
    path = Path(tmp_path_factory.mktemp("pg", numbered=True))
    server = pgserver.get_server(path, cleanup_mode="delete")
    socket_dir = server.get_uri().split("host=")[1]
    yield server, path, f"postgres://postgres@/postgres?host={socket_dir}"
    server.cleanup()


def test_a_worker_survives_a_postgresql_restart_and_loses_nothing(
    throwaway_postgres, worker_env, start_worker
) -> None:
    import pgserver

    server, pgdata, url = throwaway_postgres
    env = {**worker_env, "DATABASE_URL": url}
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env, cwd=ROOT, check=True
    )
    dsn = url.replace("postgres://postgres@/postgres?host=", "dbname=postgres user=postgres host=")

    def count(sql: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute(sql).fetchone()[0]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO django_jobs_job (task, args, max_attempts)"
            " SELECT 'tests.sleep', '[0.4]', 1 FROM generate_series(1, 40)"
        )
    worker = start_worker(
        "--burst",
        "--concurrency",
        "2",
        env={**FAST_WORKER, "JOBS_WORKER_TIMEOUT": "60", "DATABASE_URL": url},
    )
    wait_for(lambda: count("SELECT count(*) FROM django_jobs_job WHERE state = 'done'") >= 8)
    done_before = count("SELECT count(*) FROM django_jobs_job WHERE state = 'done'")
    pgserver.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=server.system_user)
    restarted = time.monotonic()

    def progressed() -> bool:
        try:
            return count("SELECT count(*) FROM django_jobs_job WHERE state = 'done'") > done_before
        except psycopg.OperationalError:
            return False

    wait_for(progressed, timeout=60, interval=0.02)
    reconnect = time.monotonic() - restarted
    assert worker.wait(timeout=120) == 0, worker.output
    states = count("SELECT count(*) FROM django_jobs_job WHERE state <> 'done'")
    attempts = count("SELECT count(*) FROM django_jobs_attempt WHERE outcome <> 'done'")
    print(
        f"\nrestart: 40 jobs, reconnected and recorded a result {reconnect:.2f}s after the "
        f"restart; jobs not done: {states}; attempts not done: {attempts}"
    )
    assert (states, attempts) == (0, 0)
    assert "database error during" in worker.output
    assert "database reachable again" in worker.output


def test_chaos_random_kills_lose_nothing_and_rerun_only_killed_jobs(
    worker_env, start_worker
) -> None:
    jobs = record.using(max_attempts=10).enqueue_many(((), {"seconds": 0.2}) for _ in range(300))
    ids = [j.pk for j in jobs]
    env = {**FAST_WORKER}
    reaper = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "reapjobs", "--loop", "--interval", "1"],
        cwd=ROOT,
        env={**worker_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rng = random.Random(7)
    generation = 0
    workers = [start_worker("--concurrency", "2", name=f"chaos-{i}-0", env=env) for i in range(4)]
    kills: list[tuple[str, object]] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < 15:
            time.sleep(rng.uniform(2, 4))
            slot = rng.randrange(4)
            victim = workers[slot]
            victim.kill()
            victim.proc.wait()
            with connection.cursor() as cursor:
                cursor.execute("SELECT now()")
                kills.append((victim.name, cursor.fetchone()[0]))
            generation += 1
            # A new pod name: the reaper, not start-up recovery, must find the orphans.
            workers[slot] = start_worker(
                "--concurrency", "2", name=f"chaos-{slot}-{generation}", env=env
            )

        def all_terminal() -> bool:
            return not Job.objects.filter(pk__in=ids).exclude(state__in=["done", "error"]).exists()

        wait_for(all_terminal, timeout=180, interval=0.5)
        elapsed = time.monotonic() - started
    finally:
        reaper.terminate()
        reaper_output = reaper.communicate(timeout=30)[0]
        for worker in workers:
            worker.kill()

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.job_id, count(*) AS runs,
                   bool_or(a.outcome = 'lost') AS had_lost_attempt
            FROM testjobs_execution e
            JOIN django_jobs_attempt a ON a.job_id = e.job_id
            GROUP BY e.job_id
            """
        )
        rows = cursor.fetchall()
        cursor.execute(
            """
            SELECT a.worker_id, a.finished_at FROM django_jobs_attempt a
            WHERE a.outcome = 'lost'
            """
        )
        lost_attempts = cursor.fetchall()
        cursor.execute("SELECT job_id, count(*) FROM testjobs_execution GROUP BY job_id")
        executions = dict(cursor.fetchall())
    lost_jobs = {job_id for job_id, _, had_lost in rows if had_lost}
    reruns = {job_id for job_id, n in executions.items() if n > 1}
    done = Job.objects.filter(pk__in=ids, state="done").count()
    kill_times = dict(kills)
    recovery = [
        (finished - kill_times[wid.rsplit(":", 2)[0]]).total_seconds()
        for wid, finished in lost_attempts
        if wid.rsplit(":", 2)[0] in kill_times
    ]
    print(
        f"\nchaos: 300 jobs, 4 workers, {len(kills)} kills, {len(lost_attempts)} lost attempts, "
        f"{sum(n - 1 for n in executions.values())} re-executions, lost jobs = "
        f"{300 - done}, done = {done}, kill-to-recovery "
        f"{min(recovery, default=0):.1f}-{max(recovery, default=0):.1f}s, {elapsed:.0f}s in all"
    )
    assert done == 300
    assert set(executions) == set(ids)  # every job ran
    assert reruns <= lost_jobs  # the only double executions are of jobs whose worker was killed
    assert kills and lost_attempts
    assert "reaped job" in reaper_output
