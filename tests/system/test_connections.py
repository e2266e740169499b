"""Connections: LISTEN/NOTIFY wake-up, bounded waits, multi-host DSNs, and a real pgbouncer in
transaction-pooling mode in front of the test database."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from django_jobs.models import Attempt, Job, Worker
from support import pgbouncer as pgbouncer_launcher
from support.pgbouncer import PgBouncer
from testproject.testjobs.jobs import echo, record, sleep
from tests.conftest import ROOT, connect, database_url, wait_for
from tests.crashable import PORT, running_cluster
from tests.factories import AttemptFactory, JobFactory
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


def started_after_commit(job: Job) -> float:
    job.refresh_from_db()
    return (job.started_at - job.created_at).total_seconds()


def listening_and_idle() -> bool:
    """Whether a worker has registered, listens, and has nothing left to claim: from here on,
    only a notification or its next poll (30s away in these tests) can make it claim."""
    with connect() as observer:
        listening = observer.execute(
            "SELECT count(*) FROM pg_stat_activity"
            # Every statement of a LISTEN connection names "listen" (LISTEN, then the election
            # of the listener: worker/wakeup.py); the queue connection's never do.
            " WHERE query ILIKE '%%listen%%' AND datname = current_database()"
            " AND pid <> pg_backend_pid()",
        ).fetchone()[0]
    return bool(listening) and Worker.objects.exists()


def test_an_idle_worker_wakes_on_notify_not_on_its_poll(start_worker) -> None:
    worker = start_worker("--poll-interval", "30", env={"JOBS_LISTEN": "true"})
    wait_for(listening_and_idle)
    job = echo.enqueue("wake up")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=10)
    # By the database's clock: milliseconds, and what a busy machine adds; its next poll is 30 s
    # away.
    assert started_after_commit(job) < BUSY_MACHINE_MARGIN
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def sessions_of(worker_id: str) -> list[str]:
    """The last statement of each server session that a worker opened: every connection of a
    worker carries its id as application_name (worker/supervisor.py)."""
    with connect() as observer:
        rows = observer.execute(
            "SELECT query FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [worker_id],
        ).fetchall()
    return [query for (query,) in rows]


def test_without_listen_the_worker_polls(start_worker) -> None:
    worker = start_worker("--poll-interval", "0.5", env={"JOBS_LISTEN": "false"})
    wait_for(Worker.objects.exists)  # registered: from here on, it polls an empty queue
    job = echo.enqueue("found by polling")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=10)
    # It claimed and finished the job, so its loop has turned: a worker that listens opens its
    # LISTEN connection on the loop's first turn, before any claim, and keeps it open. This one
    # has its queue connection, and no session whose statements name "listen".
    sessions = sessions_of(Worker.objects.get().id)
    assert sessions, "no server session carries the worker's id"
    assert [query for query in sessions if "listen" in query.lower()] == []
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_a_rolled_back_enqueue_wakes_nobody() -> None:
    from django.db import transaction

    with connect() as listener:
        listener.execute("LISTEN django_jobs")
        with pytest.raises(RuntimeError), transaction.atomic():
            echo.enqueue()
            raise RuntimeError("roll back")
        assert list(listener.notifies(timeout=0.3)) == []
        echo.using(queue="reports").enqueue()
        # Sent at the commit: the waits are for what a busy machine may add (the checks that
        # nothing comes cannot fail on a slow machine).
        notes = list(listener.notifies(timeout=BUSY_MACHINE_MARGIN, stop_after=1))
        assert [n.payload for n in notes] == ["reports"]  # the queue name, and nothing else
        # A bulk enqueue wakes workers once, at its commit; jobs that are not ready, never.
        echo.using(queue="reports", run_after=timedelta(hours=1)).enqueue_many([((), {})])
        assert list(listener.notifies(timeout=0.3)) == []
        echo.using(queue="imports").enqueue_many([((), {})] * 100)
        notes = list(listener.notifies(timeout=BUSY_MACHINE_MARGIN, stop_after=1))
        notes += listener.notifies(timeout=0.5)  # one a job would have come with the first
    assert [n.payload for n in notes] == ["imports"]


def test_a_lock_timeout_delays_a_finish_but_never_fails_the_job(start_worker) -> None:
    job = sleep.using(max_attempts=1).enqueue(0.5)
    worker = start_worker("--burst", env={"JOBS_LOCK_TIMEOUT_MS": "100"})
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running")
    with connect() as blocker, blocker.transaction():
        blocker.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [job.pk])
        time.sleep(2.5)  # the finish keeps running into its 100 ms lock timeout
        assert Job.objects.get(pk=job.pk).state == "running"
    assert worker.wait(timeout=60) == 0, worker.output
    job.refresh_from_db()
    assert job.state == "done" and job.attempt == 1
    assert "lock timeout" in worker.output


def test_a_multi_host_url_reaches_the_writable_server(start_worker, tmp_path) -> None:
    s = connection.settings_dict
    host = s["HOST"] or s["OPTIONS"].get("host") or "127.0.0.1"
    port = str(s["PORT"] or s["OPTIONS"].get("port") or 5432)
    user, name = s["USER"] or "postgres", s["NAME"]
    # The second host has no server: a socket directory with no socket in it.
    nowhere = (str(tmp_path), port)
    # The first host is a server that takes the connection but is read-only: only
    # target_session_attrs=read-write turns it down (libpq asks it whether it is).
    settings = {"default_transaction_read_only": "on", "log_connections": "on"}
    with running_cluster(settings) as read_only:
        with read_only.connect(options="-c default_transaction_read_only=off") as conn:
            if user != "postgres":
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(user)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        with psycopg.connect(
            host=str(read_only.root), port=PORT, user=user, dbname=name, autocommit=True
        ) as conn:
            assert conn.execute("SHOW transaction_read_only").fetchone() == ("on",)
        query = urlencode(
            {
                "host": f"{read_only.root},{nowhere[0]},{host}",
                "port": f"{PORT},{nowhere[1]},{port}",
                "target_session_attrs": "read-write",
            }
        )
        url = f"postgres://{quote(user, safe='')}@/{name}?{query}"
        job = echo.enqueue("via the third host")
        worker = start_worker("--burst", env={"DATABASE_URL": url})
        assert worker.wait() == 0, worker.output
        log = read_only.log.read_text()
    assert Job.objects.get(pk=job.pk).state == "done"
    # The worker did meet the read-only server first: it logged in there, and went on.
    assert f"database={name} application_name={worker.name}:" in log, log


def test_the_job_system_keeps_no_session_state() -> None:
    """No plain SET, no session advisory locks, no temp tables: safe behind any pooler."""
    offenders = []
    for path in (ROOT / "django_jobs").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            # A SQL statement (a string, or after a semicolon) that is a SET but not SET LOCAL.
            plain_set = re.search(r"""(["']|;\s*)SET\s+(?!LOCAL\b)""", code)
            session_config = re.search(r"set_config\([^)]*\bfalse\b", code, re.IGNORECASE)
            locks = re.search(r"pg_advisory_(un)?lock\(|TEMP(ORARY)? TABLE", code)
            if plain_set or session_config or locks:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


# ----------------------------------------------------------------------------------- pgbouncer


def upstream() -> dict[str, str]:
    """The test server for pgbouncer: its host (or Unix socket directory), port and user."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {
        "host": db.get("HOST") or db.get("OPTIONS", {}).get("host") or "127.0.0.1",
        "port": str(db.get("PORT") or db.get("OPTIONS", {}).get("port") or 5432),
        "user": db.get("USER") or "postgres",
    }


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[PgBouncer]:
    """A real pgbouncer in transaction-pooling mode, with a pool of 3 server connections.

    Without pgbouncer, tests/conftest.py skips the tests that use this fixture."""
    bouncer = pgbouncer_launcher.start(**upstream())
    yield bouncer
    bouncer.stop()
    # Its server connections may linger a moment; the test database is about to be dropped.
    with connect() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def pooled_env(pgbouncer: PgBouncer, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": pgbouncer.url(connection.settings_dict["NAME"]),
        "DATABASE_POOLER": "transaction",
        **extra,
    }


def manage(worker_env: dict, env: dict, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**worker_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_the_whole_lifecycle_runs_through_pgbouncer_in_transaction_mode(
    pgbouncer, worker_env, start_worker
) -> None:
    env = pooled_env(
        pgbouncer, JOBS_LISTEN="false", JOBS_POLL_INTERVAL="0.2", JOBS_HEARTBEAT_INTERVAL="0.5"
    )
    # Enqueue through the pooler: plain jobs, a chain, a job to cancel and a job that fails.
    manage(
        worker_env,
        env,
        "shell",
        "-c",
        textwrap.dedent("""
        from django.db import transaction
        from testproject.testjobs.jobs import record, fail, sleep
        with transaction.atomic():
            jobs = record.enqueue_many(((), {"note": str(i)}) for i in range(40))
            record.using(depends_on=[jobs[0], jobs[1]]).enqueue(note="after two")
        fail.enqueue("to be retried")
        sleep.using(queue="later").enqueue(60).cancel()
    """),
    )
    # A running job of a worker that is gone, for reapjobs to recover through the pooler.
    orphan = JobFactory(
        claimed=True, worker_id="gone-pod:1:abcdef", max_attempts=2, task="tests.record"
    )
    AttemptFactory(job=orphan, number=1, worker_id=orphan.worker_id)
    assert "reaped 1 job(s): 1 retried" in manage(worker_env, env, "reapjobs")
    Job.objects.filter(pk=orphan.pk).update(run_after=orphan.created_at)

    worker = start_worker("--burst", "--concurrency", "3", env=env)
    assert worker.wait(timeout=120) == 0, worker.output
    assert Job.objects.filter(task="tests.record", state="done").count() == 42
    failed = Job.objects.get(task="tests.fail")
    assert failed.state == "error"
    assert Job.objects.get(task="tests.sleep").state == "cancelled"

    # Retry through the pooler, and run the retried job.
    manage(
        worker_env,
        env,
        "shell",
        "-c",
        f"from django_jobs.models import Job; assert Job.objects.get(pk={failed.pk}).retry()",
    )
    worker = start_worker("--burst", env=env)
    assert worker.wait(timeout=60) == 0, worker.output
    failed.refresh_from_db()
    assert failed.state == "error" and failed.attempt == 2  # it ran again (and failed again)

    log = pgbouncer.log
    assert "prepared statement" not in log and "ERROR" not in log, log
    assert "database error" not in worker.output
    pools = pgbouncer.console("SHOW POOLS")
    mine = [p for p in pools if p["database"] == connection.settings_dict["NAME"]]
    assert mine and all(p["sv_active"] + p["sv_idle"] + p["sv_used"] <= 3 for p in mine)


def test_finishes_in_flight_while_other_slots_report_run_through_pgbouncer_in_transaction_mode(
    pgbouncer, start_worker
) -> None:
    # No-op jobs on four slots: a finish is nearly always in flight (worker/round_trip.py)
    # while other executors report, on the worker's one connection through the pooler.
    echo.enqueue_many(((i,), {}) for i in range(400))
    env = pooled_env(pgbouncer, JOBS_LISTEN="false")
    worker = start_worker("--burst", "--concurrency", "4", env=env)
    assert worker.wait(timeout=120) == 0, worker.output

    assert Job.objects.filter(task="tests.echo", state="done").count() == 400
    assert Attempt.objects.filter(job__task="tests.echo").count() == 400  # each ran once
    assert "database error" not in worker.output and " lease lost" not in worker.output
    log = pgbouncer.log
    assert "prepared statement" not in log and "ERROR" not in log, log
    pools = pgbouncer.console("SHOW POOLS")
    mine = [p for p in pools if p["database"] == connection.settings_dict["NAME"]]
    assert mine and all(p["sv_active"] + p["sv_idle"] + p["sv_used"] <= 3 for p in mine)


def test_listen_goes_to_the_server_directly_while_queue_work_goes_through_pgbouncer(
    pgbouncer, start_worker
) -> None:
    env = pooled_env(pgbouncer, JOBS_LISTEN="true", JOBS_LISTEN_DATABASE_URL=database_url())
    worker = start_worker("--poll-interval", "30", env=env)
    wait_for(listening_and_idle)
    job = record.enqueue(note="woken")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=10)
    # By the database's clock: milliseconds, and what a busy machine adds; its next poll is 30 s
    # away.
    assert started_after_commit(job) < BUSY_MACHINE_MARGIN

    # By backend pid, not client port: over a Unix socket every client port is -1.
    pooled_backends = {s["remote_pid"] for s in pgbouncer.console("SHOW SERVERS")}
    with connect() as observer:
        listeners = observer.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE query ILIKE '%%listen%%' AND datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    assert len(listeners) == 1 and listeners[0][0] not in pooled_backends
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output


def test_a_pgbouncer_left_behind_is_stopped_by_its_pid_and_nothing_else_is(pgbouncer) -> None:
    # A test run killed with its pgbouncer still up: it exits without stopping it.
    killed_run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from support import pgbouncer; "
            "bouncer = pgbouncer.start(*sys.argv[1:]); "
            "print(bouncer.process.pid, bouncer.directory, flush=True); "
            "os._exit(0)",  # no atexit, as for a SIGKILL
            *upstream().values(),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    pid, directory = killed_run.stdout.split()
    left_behind = int(pid)
    assert running(left_behind)
    # What a pattern kill ("django-jobs-pgbouncer-") would hit too: a tail -f on its log, and
    # this run's own pgbouncer. And a pid recorded by a run long gone, now another program's.
    tail = subprocess.Popen(["tail", "-f", f"{directory}/pgbouncer.log"])
    reused = subprocess.Popen(["sleep", "60"])
    stale_record = pgbouncer_launcher.PIDS / f"pgbouncer-{reused.pid}.json"
    stale_record.write_text(
        json.dumps(
            {
                "pid": reused.pid,
                "started_by": 1,
                "config": "/tmp/django-jobs-pgbouncer-gone/pgbouncer.ini",
            }
        )
    )
    try:
        assert left_behind in pgbouncer_launcher.stop_leftovers()
        assert not running(left_behind)
        assert not Path(directory).exists()
        assert not (pgbouncer_launcher.PIDS / f"pgbouncer-{left_behind}.json").exists()
        assert tail.poll() is None and reused.poll() is None
        assert not stale_record.exists()
        assert pgbouncer.console("SHOW VERSION") and pgbouncer.record.exists()
    finally:
        for process in (tail, reused):
            process.kill()
            process.wait()


def running(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())  # a zombie's is empty
    except OSError:
        return False
