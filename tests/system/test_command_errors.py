"""The first mistakes of a new deployment, as the commands meet them: the job tables not
migrated yet, a database that refuses the connection, a queue name with a typo, a task that is
not registered. Each gets one line that says what to do, and no traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_jobs.exceptions import REGISTERED_TASKS_HINT, UnknownTask
from tests.conftest import ROOT, connect, database_url, wait_for
from tests.timing import BUSY_MACHINE_MARGIN, PROCESS_START

pytestmark = pytest.mark.django_db(transaction=True)

#: A port where nothing listens: the connection is refused at once.
REFUSED = "postgres://postgres@127.0.0.1:1/django_jobs"
#: The app's migrations, oldest first, as the messages list them.
MIGRATIONS = sorted(p.stem for p in (ROOT / "django_jobs" / "migrations").glob("0*.py"))

ONE_SHOT_COMMANDS = [
    ["jobstats"],
    ["reapjobs"],
    ["prunejobs"],
    ["rollupjobs"],
    ["jobqueue", "list"],
    ["jobqueue", "pause", "default"],
    ["syncschedules"],
    ["jobs", "list"],
    ["jobs", "retry", "1"],
]


@contextlib.contextmanager
def new_empty_database(suffix: str) -> Iterator[str]:
    """The URL of a database of its own on the test server, with no table at all."""
    with connect() as conn:
        name = f"{conn.info.dbname}_{suffix}"
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url, _, options = database_url().partition("?")
    yield url.rsplit("/", 1)[0] + f"/{name}" + (f"?{options}" if options else "")
    with connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def empty_database(django_db_setup: None) -> Iterator[str]:
    """An empty database, shared by the tests that leave it so."""
    with new_empty_database("empty") as url:
        yield url


def manage(
    *args: str, url: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command's only line on stderr; it must have failed, without a traceback."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert result.returncode == 1, (result.returncode, result.stderr)
    return lines[0]


@pytest.mark.parametrize("command", ONE_SHOT_COMMANDS, ids=" ".join)
def test_a_command_without_the_job_tables_says_to_migrate_and_which_migrations(
    command: list[str], empty_database: str
) -> None:
    line = one_line(manage(*command, url=empty_database))
    assert "run `python manage.py migrate`" in line
    assert "django_jobs migration(s) not applied (0001_initial, …, " in line
    name = empty_database.split("?")[0].rsplit("/", 1)[1]
    assert "in database 'default' at " in line and f"/{name}: {len(MIGRATIONS)} django_jobs" in line


@pytest.mark.parametrize("command", ONE_SHOT_COMMANDS, ids=" ".join)
def test_a_command_on_a_refused_connection_names_the_alias_and_the_host(
    command: list[str],
) -> None:
    line = one_line(manage(*command, url=REFUSED))
    assert "the database 'default' at 127.0.0.1:1/django_jobs is unreachable" in line
    assert "Connection refused" in line


def test_a_burst_worker_without_the_job_tables_exits_1_at_once(empty_database: str) -> None:
    started = time.monotonic()
    result = manage("runjobworker", "--burst", url=empty_database, timeout=60)
    took = time.monotonic() - started
    line = one_line(result)
    assert "run `python manage.py migrate`" in line and MIGRATIONS[-1] in line
    # The start-up of Django and one check, no retries: a worker that waited for the tables as
    # for a database that is away would try again every few seconds until killed (at 60 s).
    assert took < PROCESS_START + BUSY_MACHINE_MARGIN, f"took {took:.1f}s"


def test_enqueue_without_the_job_tables_or_the_database_raises_what_to_do(
    empty_database: str,
) -> None:
    code = (
        "from django.db import DatabaseError, OperationalError, ProgrammingError\n"
        "from django_jobs.exceptions import DatabaseUnreachable, JobTablesMissing\n"
        "from testproject.testjobs.jobs import echo\n"
        "try:\n"
        "    echo.enqueue(1)\n"
        "except DatabaseError as error:\n"
        "    print(type(error).__name__, isinstance(error, ProgrammingError),\n"
        "          isinstance(error, OperationalError), '|', error)\n"
    )
    missing = manage("shell", "-v", "0", "-c", code, url=empty_database)
    assert missing.stdout.startswith("JobTablesMissing True False | "), missing
    assert "run `python manage.py migrate`" in missing.stdout
    assert f"not applied (0001_initial, …, {MIGRATIONS[-1]})" in missing.stdout
    down = manage("shell", "-v", "0", "-c", code, url=REFUSED)
    assert down.stdout.startswith("DatabaseUnreachable False True | "), down
    assert "the database 'default' at 127.0.0.1:1/django_jobs is unreachable" in down.stdout


class Running:
    """A long-running command whose output goes to a file, to be read while it runs."""

    def __init__(self, args: list[str], url: str, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": "testproject.settings",
                "PYTHONUNBUFFERED": "1",
            },
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_worker_waits_for_the_job_tables_with_one_line_then_starts(tmp_path: Path) -> None:
    with new_empty_database("migrating") as url:
        worker_and_scheduler_wait_then_start(url, tmp_path)


def worker_and_scheduler_wait_then_start(empty_database: str, tmp_path: Path) -> None:
    worker = Running(
        ["runjobworker", "--no-listen", "--poll-interval", "0.2"], empty_database, tmp_path / "w"
    )
    scheduler = Running(["runjobscheduler"], empty_database, tmp_path / "s")
    try:
        wait_for(lambda: "waiting: the job tables are missing" in worker.output, timeout=60)
        wait_for(lambda: "waiting: the job tables are missing" in scheduler.output, timeout=60)
        for process in (worker, scheduler):
            assert "run `python manage.py migrate`" in process.output
            assert "starting" not in process.output and process.proc.poll() is None
        # Migrating takes seconds, while both try again every few: still one line each.
        migrated = manage("migrate", "-v0", url=empty_database, timeout=120)
        assert migrated.returncode == 0, migrated.stderr
        wait_for(lambda: "starting: queues=*" in worker.output, timeout=60)
        wait_for(lambda: "starting:" in scheduler.output, timeout=60)
    finally:
        codes = (worker.stop(), scheduler.stop())
    assert codes == (0, 0), (worker.output, scheduler.output)
    for process in (worker, scheduler):
        assert process.output.count("waiting:") == 1, process.output
        assert "Traceback" not in process.output


def test_a_worker_on_a_refused_connection_waits_naming_the_alias_and_the_host(
    tmp_path: Path,
) -> None:
    worker = Running(["runjobworker", "--burst"], REFUSED, tmp_path / "w")
    try:
        wait_for(lambda: "unreachable" in worker.output, timeout=60)
    finally:
        assert worker.stop() == 0, worker.output
    assert (
        "worker waiting: the database 'default' at 127.0.0.1:1/django_jobs is unreachable"
        in worker.output
    )
    assert worker.output.count("unreachable") == 1 and "Traceback" not in worker.output


@pytest.mark.slow
def test_a_worker_warns_of_a_queue_that_nothing_names(worker_env: dict[str, str]) -> None:
    url = worker_env["DATABASE_URL"]
    typo = manage("runjobworker", "--burst", "--queues", "default,nonexistent-typo", url=url)
    assert typo.returncode == 0, typo.stderr
    warnings = [line for line in typo.stderr.splitlines() if "named by nothing" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], typo.stderr
    assert "'nonexistent-typo'" in warnings[0] and "'default'" not in warnings[0]
    fine = manage("runjobworker", "--burst", "--queues", "default,reports,imports", url=url)
    assert fine.returncode == 0 and "named by nothing" not in fine.stderr, fine.stderr


def test_an_unknown_task_says_where_jobs_are_defined_and_how_to_list_them(
    worker_env: dict[str, str],
) -> None:
    message = str(UnknownTask("reports.biuld"))
    assert "installed app's jobs.py" in message and REGISTERED_TASKS_HINT in message
    # The way to list them that the message gives works, and lists the tasks.
    command = REGISTERED_TASKS_HINT.split("python manage.py ", 1)[1].split()  # jobs tasks
    listed = manage(*command, url=worker_env["DATABASE_URL"])
    assert listed.returncode == 0 and "tests.echo " in listed.stdout, listed
