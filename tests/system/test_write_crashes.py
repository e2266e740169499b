"""A PostgreSQL server crash right after each write the job system commits itself, on a server
whose ``synchronous_commit`` an operator turned ``off``: ``kill -9`` of a throwaway cluster's
postmaster and its children, with the WAL writer stopped so that anything not flushed at commit
is certainly lost.

Each write is made by the code path an operator or a scheduler uses (in a ``manage.py shell``
process on the cluster), which reports what it did; after the restart, the database must hold
exactly that. Before each write, a checkpoint makes what the test set up durable, so that only
the write itself is at stake.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crashable import CrashableCluster, running_cluster

pytestmark = [pytest.mark.slow, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
DB = "jobs"
NEW_SCHEDULE = {"crash-sync": {"task": "tests.echo", "cron": "* * * * *"}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[CrashableCluster]:
    """One cluster for the module's writes (the shared fixture's is one per test), on which an
    operator turned ``synchronous_commit`` off."""
    with running_cluster({"synchronous_commit": "off"}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def jobs_env(cluster: CrashableCluster) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "PYTHONUNBUFFERED": "1",
    }
    return cluster.migrated_database(DB, env)


def django(code: str, env: dict[str, str], *, report: bool = True) -> Any:
    """Run ``code`` in ``manage.py shell`` on the cluster; return the JSON it printed last (with
    ``report``)."""
    prelude = "import json\nfrom django_jobs.models import Job, Schedule, ScheduleTick\n"
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", prelude + code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if not report:
        return None
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr
    return json.loads(lines[-1])


@dataclasses.dataclass(frozen=True)
class Write:
    """``setup`` runs first, and is made durable; then ``write``, whose printed JSON report
    must equal, after the crash, what ``check`` prints."""

    setup: str
    write: str
    check: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)


SCHEDULE = (
    "s = Schedule.objects.create(name='crash', task='tests.echo', cron='* * * * *')\n"
    "s.recompute_next_run()\n"
)
SCHEDULE_STATE = (
    "s = Schedule.objects.get(name='crash')\n"
    "print(json.dumps({'paused': s.paused, 'next': s.next_run_at.isoformat(), 'cron': s.cron,"
    " 'ticks': list(ScheduleTick.objects.filter(schedule=s).values_list('job_id', flat=True))}))"
)
QUEUE_STATE = (
    "from django_jobs.models import Queue\n"
    "q = Queue.objects.get(name='default')\n"
    "print(json.dumps({'paused': q.paused, 'limit': q.concurrency_limit}))"
)
TOKEN_STATE = (
    "from django_jobs.models import ApiToken\n"
    "print(json.dumps([[t.name, t.revoked_at is not None] for t in ApiToken.objects.all()]))"
)
JOBS_STATE = (
    "from django_jobs.models import Dependency\n"
    "print(json.dumps({'jobs': sorted(Job.objects.values_list('id', 'state', 'parent_id')),"
    " 'dependencies': sorted(Dependency.objects.values_list('job_id', 'depends_on_id'))}))"
)
A_JOB = "from tests.factories import JobFactory\n"
FIRE = (
    "from django_jobs.store.connection import QueueConnection\n"
    "from django_jobs.worker.duties import PostgresDuties\n"
    "duties = PostgresDuties(QueueConnection('default', 'crash-test'))\n"
)

WRITES: dict[str, Write] = {
    "schedule tick": Write(
        SCHEDULE + "Schedule.objects.filter(pk=s.pk).update(next_run_at=s.next_run_at"
        " - __import__('datetime').timedelta(minutes=1))",
        FIRE + "assert duties.fire_schedules(['tests.echo']).fired == 1\n" + SCHEDULE_STATE,
        SCHEDULE_STATE,
    ),
    "schedule run now": Write(
        SCHEDULE, "Schedule.objects.get(name='crash').run_now()\n" + SCHEDULE_STATE, SCHEDULE_STATE
    ),
    "schedule pause": Write(
        SCHEDULE,
        "Schedule.objects.get(name='crash').pause('ops')\n" + SCHEDULE_STATE,
        SCHEDULE_STATE,
    ),
    "schedule resume": Write(
        SCHEDULE + "s.pause('ops')\nSchedule.objects.filter(pk=s.pk).update(next_run_at="
        "s.next_run_at - __import__('datetime').timedelta(hours=1))",
        "Schedule.objects.get(name='crash').resume()\n" + SCHEDULE_STATE,
        SCHEDULE_STATE,
    ),
    "schedule edit in the admin": Write(
        SCHEDULE + "from django.contrib.auth.models import User\n"
        "User.objects.create_superuser('root', password='x')",
        "from django.test import Client\nfrom django.test.utils import setup_test_environment\n"
        "from django.urls import reverse\nsetup_test_environment()\n"
        "from django.contrib.auth.models import User\n"
        "s = Schedule.objects.get(name='crash')\n"
        "c = Client()\nc.force_login(User.objects.get(username='root'))\n"
        "r = c.post(reverse('admin:django_jobs_schedule_change', args=[s.pk]), {'name': 'crash',"
        " 'task': 'tests.echo', 'cron': '7 * * * *', 'timezone': 'UTC', 'args': '[]',"
        " 'kwargs': '{}', 'queue': '', 'priority': '', 'catch_up': 'skip', 'overlap': 'allow',"
        " 'when_queue_paused': 'skip'})\n"
        "assert r.status_code == 302, r.content\n" + SCHEDULE_STATE,
        SCHEDULE_STATE,
    ),
    "syncschedules": Write(
        "",
        "from django.core.management import call_command\ncall_command('syncschedules')\n"
        "print(json.dumps(sorted(Schedule.objects.values_list('name', flat=True))))",
        "print(json.dumps(sorted(Schedule.objects.values_list('name', flat=True))))",
        {"JOBS_SCHEDULES": json.dumps(NEW_SCHEDULE)},
    ),
    "start-up sync of a scheduler": Write(
        "",
        FIRE + "from django_jobs.schedules.runner import Scheduler\n"
        "from django_jobs.worker.postgres_queue import PostgresQueue, QueueGate\n"
        "scheduler = Scheduler(duties, QueueGate(PostgresQueue(duties.connection)))\n"
        "scheduler.step()\nassert scheduler.synced\n"
        "print(json.dumps(sorted(Schedule.objects.values_list('name', flat=True))))",
        "print(json.dumps(sorted(Schedule.objects.values_list('name', flat=True))))",
        {"JOBS_SCHEDULES": json.dumps(NEW_SCHEDULE)},
    ),
    "queue pause": Write(
        "",
        "from django_jobs import queues\nqueues.pause('default', by='ops')\n" + QUEUE_STATE,
        QUEUE_STATE,
    ),
    "queue resume": Write(
        "from django_jobs import queues\nqueues.pause('default', by='ops')",
        "from django_jobs import queues\nqueues.resume('default')\n" + QUEUE_STATE,
        QUEUE_STATE,
    ),
    "queue limit": Write(
        "",
        "from django_jobs import queues\nqueues.set_limit('default', 3)\n" + QUEUE_STATE,
        QUEUE_STATE,
    ),
    "token create": Write(
        "",
        "from django_jobs.tokens import auth\nauth.create('crash', ['default'])\n" + TOKEN_STATE,
        TOKEN_STATE,
    ),
    "token revoke": Write(
        "from django_jobs.tokens import auth\nauth.create('crash', ['default'])",
        "from django_jobs.tokens import auth\nfrom django_jobs.models import ApiToken\n"
        "assert auth.revoke([ApiToken.objects.get().pk]) == 1\n" + TOKEN_STATE,
        TOKEN_STATE,
    ),
    "operator retry": Write(
        A_JOB + "from django.utils import timezone\n"
        "JobFactory(state='error', finished_at=timezone.now())",
        "from django_jobs import operator_actions\n"
        "assert operator_actions.retry(Job.objects.all()).changed == 1\n" + JOBS_STATE,
        JOBS_STATE,
    ),
    "operator cancel": Write(
        A_JOB + "JobFactory()",
        "from django_jobs import operator_actions\n"
        "assert operator_actions.cancel(Job.objects.all()).changed == 1\n" + JOBS_STATE,
        JOBS_STATE,
    ),
    "enqueue": Write(
        "", "from testproject.testjobs.jobs import echo\necho.enqueue(1)\n" + JOBS_STATE, JOBS_STATE
    ),
    "enqueue with depends_on": Write(
        "from testproject.testjobs.jobs import echo\necho.enqueue(0)",
        "from testproject.testjobs.jobs import echo\n"
        "echo.using(depends_on=[Job.objects.get()]).enqueue(1)\n" + JOBS_STATE,
        JOBS_STATE,
    ),
    "enqueue_many": Write(
        "",
        "from testproject.testjobs.jobs import echo\n"
        "echo.enqueue_many([((1,), {}), ((2,), {})])\n" + JOBS_STATE,
        JOBS_STATE,
    ),
    "spawn": Write(
        A_JOB + "JobFactory(claimed=True, lease='5f0c3a38-1f43-4a5c-9a4e-1d1b8d3c6a11')",
        "from django_jobs.context import JobContext\nfrom testproject.testjobs.jobs import echo\n"
        "j = Job.objects.get()\n"
        "JobContext(job_id=j.pk, task=j.task, attempt=j.attempt, max_attempts=j.max_attempts,"
        " worker_id=j.worker_id, lease=str(j.lease)).spawn(echo, 1)\n" + JOBS_STATE,
        JOBS_STATE,
    ),
}


def _empty(cluster: CrashableCluster) -> None:
    """Start each write from empty tables."""
    tables = [
        "django_jobs_dependency",
        "django_jobs_schedule_tick",
        "django_jobs_job",
        "django_jobs_schedule",
        "django_jobs_queue",
        "django_jobs_api_token",
        "auth_user",
    ]
    cluster.query(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE", dbname=DB)


@pytest.mark.parametrize("name", list(WRITES))
def test_a_write_the_job_system_committed_survives_a_crash_of_an_asynchronous_server(
    name: str, cluster: CrashableCluster, jobs_env: dict[str, str]
) -> None:
    write = WRITES[name]
    env = {**jobs_env, **write.env}
    _empty(cluster)
    if write.setup:
        django(write.setup, env, report=False)
    cluster.query("CHECKPOINT")  # what was set up is on disk: only the write is at stake
    cluster.stop_wal_writer()
    reported = django(write.write, env)
    unwritten = cluster.unwritten_wal()
    crashed = time.monotonic()
    cluster.crash()
    cluster.start()
    print(
        f"\ncrash after {name}: unwritten_wal_bytes={unwritten}"
        f" restart_s={time.monotonic() - crashed:.1f}"
    )
    assert django(write.check, env) == reported
