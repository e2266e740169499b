"""``JOBS_READ_DATABASE``: the dashboard, ``jobstats`` and the stats readers on a read-only
alias (here the same server under a read-only role, as a replica would be), while the job list,
the actions and every write stay on the primary."""

from __future__ import annotations

import io
from collections.abc import Iterator

import psycopg
import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_jobs.models import Job
from tests.conftest import connect
from tests.factories import JobFactory

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
