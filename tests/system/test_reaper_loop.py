"""``reapjobs --loop`` outlives the database going away: a killed session, and a restart of the
server (a fast shutdown, as ``pg_ctl restart -m fast`` does), without spinning while it is down."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_jobs.models import Attempt, Job
from tests.conftest import ROOT, wait_for
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL = "0.5"
FAILED_PASS = "reaper pass failed"


class Reaper:
    """``manage.py reapjobs --loop`` in a subprocess, its output (stdout and stderr) in a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, ROOT / "manage.py", "reapjobs", "--loop", "--interval", INTERVAL],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    @property
    def output(self) -> str:
        return self.log.read_text()

    def passes(self) -> int:
        """Passes that ended, by their summary lines."""
        return len(re.findall(r"^reaped \d+ job\(s\):", self.output, re.MULTILINE))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def start_reaper(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Reaper]]:
    started: list[Reaper] = []

    def start(env: dict[str, str]) -> Reaper:
        started.append(Reaper(env, tmp_path / f"reaper-{len(started)}.log"))
        return started[-1]

    yield start
    for reaper in started:
        if reaper.proc.poll() is None:
            reaper.proc.kill()
            reaper.proc.wait()


def reaped_or_exited(reaper: Reaper, job_id: int) -> bool:
    return reaper.proc.poll() is not None or Job.objects.get(pk=job_id).state != "running"


def test_reapjobs_loop_outlives_its_session_being_killed(worker_env, start_reaper) -> None:
    reaper = start_reaper(worker_env)
    wait_for(lambda: reaper.passes() >= 1 or reaper.proc.poll() is not None)
    with connection.cursor() as cursor:
        # What a failover, a restart or an operator does to the reaper's session.
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    # A job whose worker is gone, for the reaper's next passes to find.
    job = JobFactory(claimed=True, worker_id="gone:1:abcdef")
    AttemptFactory(job=job, number=1, worker_id="gone:1:abcdef")

    wait_for(lambda: reaped_or_exited(reaper, job.pk), timeout=30)

    assert reaper.proc.poll() is None, reaper.output
    assert Job.objects.get(pk=job.pk).state == "pending"
    assert Attempt.objects.get(job=job).outcome == "lost"
    assert reaper.stop() == 0, reaper.output
    assert reaper.output.count(FAILED_PASS) == 1, reaper.output
    assert "database reachable again after 1 failed pass(es)" in reaper.output


@pytest.mark.slow
@pytest.mark.crash
def test_reapjobs_loop_outlives_a_server_restart_and_backs_off_meanwhile(
    cluster, worker_env, start_reaper
) -> None:
    env = cluster.migrated_database("jobs", worker_env)
    reaper = start_reaper(env)
    wait_for(lambda: reaper.passes() >= 1 or reaper.proc.poll() is not None)

    cluster.stop()  # a fast shutdown: the reaper's session ends with AdminShutdown
    time.sleep(6)  # twelve intervals without a server
    assert reaper.proc.poll() is None, reaper.output
    failed_while_down = reaper.output.count(FAILED_PASS)
    cluster.start()
    (job_id,) = cluster.query(
        "INSERT INTO django_jobs_job (task, state, attempt, worker_id, started_at)"
        " VALUES ('tests.noop', 'running', 1, 'gone:1:abcdef', now()) RETURNING id",
        dbname="jobs",
    )[0]

    def state() -> str:
        rows = cluster.query("SELECT state FROM django_jobs_job WHERE id = %s", [job_id], "jobs")
        return str(rows[0][0])

    wait_for(lambda: reaper.proc.poll() is not None or state() != "running", timeout=60)

    assert reaper.proc.poll() is None, reaper.output
    assert state() == "pending"
    assert reaper.stop() == 0, reaper.output
    # The waits doubled from the interval: 0.5, 1, 2, 4 s, not one try per interval.
    assert 1 <= failed_while_down <= 5, reaper.output
    assert "database reachable again" in reaper.output
