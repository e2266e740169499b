"""Rolling deploys and databases that are not there yet, with real worker processes.

During a rolling deploy, pods that already run the new release enqueue jobs of tasks that the
old release's workers have never heard of. Those workers hand such jobs back, without counting
an attempt, until a worker that has the task runs them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_jobs.models import Attempt, Job, Worker
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP
from tests.conftest import ROOT, database_url, wait_for
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)

NEW_TASK = "tests.new_in_this_release"
NEW_RELEASE = {"TESTJOBS_NEW_RELEASE": "1"}


def test_a_deploy_loses_no_attempts_to_workers_of_the_old_release(start_worker) -> None:
    Job.objects.bulk_create(Job(task=NEW_TASK, args=[i], max_attempts=1) for i in range(1000))
    # The old release's worker cannot run them: it hands the first one back and passes over
    # the rest, so that --burst ends.
    old = start_worker("--burst")
    assert old.wait(timeout=120) == 0, old.output
    assert "RecursionError" not in old.output and "Traceback" not in old.output
    assert set(Job.objects.values_list("state", "attempt")) == {("pending", 0)}
    assert not Attempt.objects.exists()
    (handed_back,) = Job.objects.exclude(task_missing_since=None)
    assert f"waiting for a worker that has registered task '{NEW_TASK}'" in handed_back.error
    assert "handed back 1 job(s) of task 'tests.new_in_this_release'" in old.output

    # The new release's worker runs each of them once.
    new = start_worker("--burst", "--concurrency", "2", env=NEW_RELEASE)
    assert new.wait(timeout=120) == 0, new.output
    assert set(Job.objects.values_list("state", "attempt")) == {("done", 1)}
    assert Attempt.objects.count() == Job.objects.count()
    assert sorted(Job.objects.values_list("result", flat=True)) == list(range(Job.objects.count()))


def test_a_task_that_no_worker_has_ends_in_error_after_the_timeout(start_worker) -> None:
    orphaned = Job.objects.create(task="tests.removed_long_ago", max_attempts=3)
    # A task that a live worker (busy elsewhere) has registered is never given up on.
    Worker.objects.create(
        id="new-release:1:abc", name="new-release", host="h", pid=1, tasks=[NEW_TASK]
    )
    awaited = Job.objects.create(task=NEW_TASK, max_attempts=3)
    old = start_worker(
        env={"JOBS_UNKNOWN_TASK_DELAY": "0.2", "JOBS_UNKNOWN_TASK_TIMEOUT": "1"},
    )
    try:
        orphaned = wait_for(lambda: Job.objects.filter(pk=orphaned.pk, state="error").first())
        time.sleep(1.5)  # the scenario: past JOBS_UNKNOWN_TASK_TIMEOUT (1 s), awaited stays
        awaited.refresh_from_db()
    finally:
        old.signal(signal.SIGTERM)
        old.wait()
    assert "unknown task 'tests.removed_long_ago'" in orphaned.error
    assert "No live worker has registered it for 1s (JOBS_UNKNOWN_TASK_TIMEOUT)" in orphaned.error
    assert orphaned.attempt == 1 and orphaned.attempts.get().outcome == "error"
    assert awaited.state == "pending" and awaited.attempt == 0, old.output
    assert not awaited.attempts.exists()


def test_once_a_task_has_been_missing_too_long_all_its_jobs_end_in_error(start_worker) -> None:
    gone = [Job.objects.create(task="tests.removed_long_ago", max_attempts=3) for _ in range(3)]
    # Workers first went without the task two hours ago; a job of a task that went missing just
    # now is handed back as usual.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_job SET task_missing_since = now() - interval '2 hours'"
            " WHERE id = %s",
            [gone[1].pk],
        )
    recent = Job.objects.create(task=NEW_TASK, max_attempts=3)
    old = start_worker("--burst")
    assert old.wait() == 0, old.output
    for job in gone:
        job.refresh_from_db()
        assert job.state == "error" and job.attempt == 1, (job.error, old.output)
        assert "(JOBS_UNKNOWN_TASK_TIMEOUT)" in job.error and job.task_missing_since is None
    recent.refresh_from_db()
    assert recent.state == "pending" and recent.attempt == 0 and recent.task_missing_since


def test_a_run_clears_the_mark_of_a_missing_task(start_worker) -> None:
    job = Job.objects.create(task=NEW_TASK, args=[7], max_attempts=3)
    old = start_worker("--burst")
    assert old.wait() == 0, old.output
    job.refresh_from_db()
    assert job.task_missing_since is not None
    new = start_worker("--burst", env=NEW_RELEASE)
    assert new.wait() == 0, new.output
    job.refresh_from_db()
    assert job.state == "done" and job.result == 7 and job.task_missing_since is None


@pytest.mark.slow
def test_a_worker_started_before_its_database_exists_waits_then_serves(worker_env) -> None:
    name = f"dj_later_{uuid.uuid4().hex[:8]}"
    url = database_url().replace(f"/{connection.settings_dict['NAME']}", f"/{name}", 1)
    env = {**worker_env, "DATABASE_URL": url, "JOBS_HEARTBEAT_INTERVAL": "1"}
    log = Path(f"/tmp/{name}.log")
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runjobworker", "--worker-id", "early"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    admin = _connect("postgres")
    try:
        wait_for(log.read_text, timeout=30)  # past Django's start-up: its first try failed
        busy_at_start = _cpu_seconds(worker.pid)
        time.sleep(18)  # the scenario: a while without a database
        lines = log.read_text().splitlines()
        print(f"{len(lines)} log lines in 20 s without a database:", *lines, sep="\n")
        # The first failure at once, then a line a minute: not hundreds a second.
        assert 1 <= len(lines) <= 6, "\n".join(lines[:50])
        assert worker.poll() is None, log.read_text()
        # And it waits between tries rather than spin: a fraction of a core, not all of it.
        busy = _cpu_seconds(worker.pid) - busy_at_start
        assert busy < 5, f"the worker used {busy:.1f}s of CPU in 20s without a database"

        admin.execute(f'CREATE DATABASE "{name}"')
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
            cwd=ROOT,
            env=env,
            check=True,
        )
        with _connect(name) as conn:
            job_id = conn.execute(
                "INSERT INTO django_jobs_job (task, args) VALUES ('tests.echo', '[1]') RETURNING id"
            ).fetchone()[0]
            wait_for(
                lambda: conn.execute(
                    "SELECT state = 'done' FROM django_jobs_job WHERE id = %s", [job_id]
                ).fetchone()[0],
                timeout=30,
            )
            # Retries of a database that is away are at most OUTAGE_RETRY_CAP apart: the job
            # starts within that of its insert, by the database's clock (and what a busy machine
            # adds), where a try a minute, as the log lines go, would leave it waiting.
            waited = conn.execute(
                "SELECT EXTRACT(EPOCH FROM started_at - created_at) FROM django_jobs_job"
                " WHERE id = %s",
                [job_id],
            ).fetchone()[0]
            print(f"the job started {waited:.1f}s after its insert")
            assert waited < OUTAGE_RETRY_CAP + BUSY_MACHINE_MARGIN
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
        log.unlink(missing_ok=True)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _connect(dbname: str) -> psycopg.Connection:
    """A plain autocommit connection to another database of the test server."""
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context"):
        params.pop(key, None)
    params["dbname"] = dbname
    return psycopg.connect(**params, autocommit=True)
