"""``JOBS_READ_DATABASE``: the dashboard, ``jobstats`` and the stats readers on a read-only
alias (here the same server under a read-only role, as a replica would be), while the job list,
the actions and every write stay on the primary."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_jobs import queues
from django_jobs.models import Job
from tests.conftest import ROOT, connect
from tests.factories import JobFactory
from tests.integration.helpers import silent_server
from tests.timing import BUSY_MACHINE_MARGIN

READER = "django_jobs_reader"

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])


@pytest.fixture
def replica(settings) -> Iterator[str]:
    """The ``replica`` alias: a role that may only read, in read-only transactions."""
    with connect() as conn:
        name = conn.info.dbname
        conn.execute(
            f"""
            DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER}') THEN
                    CREATE ROLE {READER} LOGIN PASSWORD '{READER}';
                END IF;
            END $$
            """
        )
        conn.execute(f"ALTER ROLE {READER} SET default_transaction_read_only = on")
        conn.execute(f'GRANT CONNECT ON DATABASE "{name}" TO {READER}')
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {READER}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER}")
    settings.JOBS_READ_DATABASE = "replica"
    yield "replica"
    connections["replica"].close()


def test_the_dashboard_and_jobstats_read_the_replica(replica, admin_client) -> None:
    JobFactory(claimed=True, task="tests.sleep", worker_id="pod-a:1:aaaaaa")
    with connections["replica"].cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone() == (READER,)
    with CaptureQueriesContext(connections["replica"]) as read:
        response = admin_client.get("/admin/django_jobs/dashboard/")
    assert response.status_code == 200 and "tests.sleep" in response.content.decode()
    assert any("django_jobs_queue_summary" in q["sql"] for q in read.captured_queries)
    assert any('FROM "django_jobs_job"' in q["sql"] for q in read.captured_queries)
    out = io.StringIO()
    with CaptureQueriesContext(connections["replica"]) as read:
        call_command("jobstats", stdout=out)
    assert "running" in out.getvalue() and read.captured_queries


def test_writes_are_refused_on_the_replica(replica) -> None:
    job = JobFactory()
    with pytest.raises(Exception) as refused, connections["replica"].cursor() as cursor:
        cursor.execute("UPDATE django_jobs_job SET priority = 5 WHERE id = %s", [job.pk])
    assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)


def test_the_job_list_and_the_actions_stay_on_the_primary(replica, admin_client) -> None:
    job = JobFactory(state="error", finished=True)
    assert str(job.pk) in admin_client.get("/admin/django_jobs/job/").content.decode()
    response = admin_client.post(
        "/admin/django_jobs/job/",
        {"action": "retry_selected", "_selected_action": [job.pk]},
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).state == "pending"


@contextlib.contextmanager
def replica_at(**changes: Any) -> Iterator[None]:
    """This thread's ``replica`` alias pointed elsewhere (HOST, PORT, NAME, USER...)."""
    wrapper = connections["replica"]
    original = wrapper.settings_dict
    wrapper.close()
    wrapper.settings_dict = {**original, **changes}
    try:
        yield
    finally:
        wrapper.close()
        wrapper.settings_dict = original


def queue_row(html: str, queue: str) -> str:
    """The dashboard's row of ``queue`` in its queues table."""
    table = html.split('id="dj-queues"', 1)[1].split("</table>", 1)[0]
    rows = [row for row in table.split("<tr>") if f"?queue={queue}" in row]
    assert len(rows) == 1, table
    return rows[0]


def test_an_unreachable_read_database_gives_the_dashboard_a_banner_and_the_primary(
    replica, admin_client
) -> None:
    JobFactory(claimed=True, task="tests.sleep", worker_id="pod-a:1:aaaaaa")
    with replica_at(HOST="127.0.0.1", PORT=1):
        response = admin_client.get("/admin/django_jobs/dashboard/")
    html = response.content.decode()
    assert response.status_code == 200
    banner = html.split('id="dj-read-problem"', 1)[1].split("</ul>", 1)[0]
    assert "the read database &#x27;replica&#x27; at 127.0.0.1:1/" in banner
    assert "is unreachable: connection failed" in banner
    assert "Showing the primary database &#x27;default&#x27; instead." in banner
    # The primary's data, and the controls.
    assert "tests.sleep" in html and 'name="pause"' in queue_row(html, "default")


@pytest.mark.timeout(90)
def test_a_read_database_that_never_answers_costs_the_dashboard_the_connect_timeout(
    replica, admin_client, settings
) -> None:
    settings.JOBS_READ_CONNECT_TIMEOUT = 2
    with silent_server() as ((host, port), accepted):  # counts connections, never answers
        started = time.monotonic()
        with replica_at(HOST=host, PORT=port):
            response = admin_client.get("/admin/django_jobs/dashboard/")
        took = time.monotonic() - started
        tries = len(accepted)
    assert response.status_code == 200
    assert "timeout expired" in response.content.decode().split('id="dj-read-problem"')[1]
    assert tries == 1, tries  # one connection tried: the page waited for it once
    # The 2 s connect timeout; without one, the page would wait as long as the server, for ever.
    assert took < 2 + BUSY_MACHINE_MARGIN, f"took {took:.1f}s"


def test_jobstats_on_an_unreachable_read_database_prints_one_line_and_exits_1(
    worker_env,
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "jobstats"],
        cwd=ROOT,
        env={
            **worker_env,
            "READ_DATABASE_URL": "postgres://postgres@127.0.0.1:1/replica",
            "JOBS_READ_DATABASE": "replica",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        "CommandError: the read database 'replica' at 127.0.0.1:1/replica is unreachable: "
        'connection failed: connection to server at "127.0.0.1", port 1 failed: '
        "Connection refused"
    ]


@pytest.fixture
def lagging_replica(worker_env) -> Iterator[str]:
    """A migrated database of its own, as a replica that stopped replaying: whatever is
    written to the primary, its control table stays as it was."""
    with connect() as conn:
        name = f"{conn.info.dbname}_lagging"
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url, _, options = worker_env["DATABASE_URL"].partition("?")
    url = url.rsplit("/", 1)[0] + f"/{name}" + (f"?{options}" if options else "")
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
        cwd=ROOT,
        env={**worker_env, "DATABASE_URL": url},
        check=True,
        timeout=300,
    )
    yield name
    with connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def lagging_params(name: str) -> dict[str, Any]:
    """psycopg's parameters for the database ``name`` on the test server."""
    params = {**connections["default"].get_connection_params(), "dbname": name}
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


@pytest.mark.slow
def test_queue_controls_come_from_the_primary_while_the_replica_lags(
    lagging_replica, admin_client, settings
) -> None:
    settings.JOBS_READ_DATABASE = "replica"
    queues.pause("reports", by="ops", reason="incident 7")
    with psycopg.connect(**lagging_params(lagging_replica), autocommit=True) as stale:
        # The replica still has "imports" paused, resumed on the primary since.
        stale.execute(
            "INSERT INTO django_jobs_queue (name, paused, paused_at, paused_by, pause_reason,"
            " limit_source, updated_at) VALUES ('imports', true, now(), 'ops', '', '', now())"
        )
    user = connections["default"].settings_dict["USER"]
    with replica_at(NAME=lagging_replica, USER=user, PASSWORD=""):
        html = admin_client.get("/admin/django_jobs/dashboard/").content.decode()
        out = io.StringIO()
        call_command("jobstats", stdout=out)
    reports, imports = queue_row(html, "reports"), queue_row(html, "imports")
    assert "paused" in reports and 'name="resume"' in reports and 'name="pause"' not in reports
    assert "incident 7" in reports
    assert ">open<" in imports and 'name="pause"' in imports and 'name="resume"' not in imports
    assert "PAUSED by ops" in out.getvalue() and "incident 7" in out.getvalue()
    assert out.getvalue().count("PAUSED") == 1


@pytest.mark.slow
def test_a_read_database_too_slow_to_answer_gives_the_dashboard_a_banner_and_the_primary(
    lagging_replica, admin_client, settings
) -> None:
    settings.JOBS_READ_DATABASE = "replica"
    settings.JOBS_STATEMENT_TIMEOUT_MS = 1000
    JobFactory(claimed=True, task="tests.sleep", worker_id="pod-a:1:aaaaaa")
    user = connections["default"].settings_dict["USER"]
    with psycopg.connect(**lagging_params(lagging_replica)) as locker:
        # An open transaction holds every read of the replica's job table back.
        locker.execute("LOCK TABLE django_jobs_job IN ACCESS EXCLUSIVE MODE")
        with replica_at(NAME=lagging_replica, USER=user, PASSWORD=""):
            response = admin_client.get("/admin/django_jobs/dashboard/")
        locker.rollback()
    html = response.content.decode()
    assert response.status_code == 200
    banner = html.split('id="dj-read-problem"', 1)[1].split("</ul>", 1)[0]
    assert "the read database &#x27;replica&#x27; at " in banner
    assert "did not answer in time: canceling statement due to statement timeout" in banner
    assert "tests.sleep" in html


@pytest.mark.slow
def test_jobstats_watch_outlasts_a_read_database_outage(lagging_replica, worker_env) -> None:
    """A dropped connection to the read database costs a refresh one line on stderr; the next
    refresh reconnects."""
    url, _, options = worker_env["DATABASE_URL"].partition("?")
    url = url.rsplit("/", 1)[0] + f"/{lagging_replica}" + (f"?{options}" if options else "")
    watch = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "jobstats", "--watch", "0.3", "--json"],
        cwd=ROOT,
        env={**worker_env, "READ_DATABASE_URL": url, "JOBS_READ_DATABASE": "replica"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None and watch.stdout.readline().startswith("{")
        with psycopg.connect(**lagging_params(lagging_replica), autocommit=True) as admin:
            cut = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert cut == (1,)
        # Refreshes after the cut: at most one may fail, then they go on.
        lines = [watch.stdout.readline() for _ in range(3)]
        assert all(line.startswith("{") for line in lines), lines
    finally:
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=60)
    assert watch.returncode == 0 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("the read database 'replica' at "), err
