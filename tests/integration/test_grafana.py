"""The shipped Grafana dashboard: every panel's SQL, expanded as Grafana would, runs against a
database with realistic data and returns the columns its panel expects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.utils import ProgrammingError

from support.grafana import expand, load, panel_queries
from tests.integration.helpers import read_only_role_sql
from tests.unit.helpers import EXPECTED_COLUMNS


def six_hours() -> dict[str, datetime]:
    """The dashboard's default time range, ending now: taken when a test runs, since the test
    data is made relative to the database's clock then (a long suite runs minutes after it
    collected this module)."""
    now = datetime.now(UTC)
    return {"time_from": now - timedelta(hours=6), "time_to": now + timedelta(minutes=1)}


ALL_QUEUES = {"queue": ["default", "reports", "imports"]}


@pytest.fixture
def busy_system(busy_queues) -> dict:
    """:func:`~tests.conftest.busy_queues`, and schedules for the Schedules panel: one on time,
    one late (no scheduler has fired it for ten minutes), one paused."""
    from django.utils import timezone

    from django_jobs.models import Schedule

    now = timezone.now()
    late = Schedule.objects.create(
        name="late-report", task="tests.echo", cron="*/5 * * * *", source="code"
    )
    late.next_run_at = now - timedelta(minutes=10)
    late.save(update_fields=["next_run_at"])
    Schedule.objects.create(
        name="on-time",
        task="tests.echo",
        cron="@daily",
        timezone="Europe/Paris",
        next_run_at=now + timedelta(hours=3),
        last_run_at=now - timedelta(hours=21),
        last_job_id=busy_queues["late"].pk,
        last_outcome="enqueued",
    )
    Schedule.objects.create(name="paused", task="tests.echo", cron="@hourly", paused=True)
    # The rollups of the last hours, for the history panels.
    from django_jobs.models import Rollup

    hour = now.replace(minute=0, second=0, microsecond=0)
    for back, outcome, jobs in ((3, "done", 40), (3, "error", 2), (2, "done", 35)):
        Rollup.objects.create(
            hour=hour - timedelta(hours=back), queue="default", task="tests.echo",
            outcome=outcome, jobs=jobs, attempts=jobs, duration_seconds_total=jobs * 1.5,
            duration_buckets=[0] * 20,
        )  # fmt: skip
    return busy_queues


def run(sql: str) -> tuple[list[str], list[tuple]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [c[0] for c in cursor.description], cursor.fetchall()


@pytest.mark.parametrize(
    ("title", "sql", "fmt"), panel_queries(), ids=[q[0] for q in panel_queries()]
)
def test_each_panel_query_returns_rows_with_its_columns(busy_system, title, sql, fmt) -> None:
    window = six_hours()
    expanded = expand(sql, **window, variables=ALL_QUEUES)
    assert "$" not in expanded, expanded
    columns, rows = run(expanded)
    assert columns == EXPECTED_COLUMNS[title]
    assert rows, f"{title} returned no rows:\n{expanded}"
    if fmt == "time_series":
        assert columns[0] == "time"
        times = [row[0] for row in rows]
        assert times == sorted(times)
        assert all(
            window["time_from"].timestamp() - 3600 <= t <= window["time_to"].timestamp() - 60
            for t in times
        )


def test_the_queue_variable_query_lists_queues_with_work(busy_queues) -> None:
    queue = next(v for v in load()["templating"]["list"] if v["name"] == "queue")
    _, rows = run(queue["query"])
    assert [r[0] for r in rows] == ["default", "reports"]


def test_a_panel_filtered_to_one_queue_sees_only_that_queue(busy_queues) -> None:
    sql = next(sql for title, sql, _ in panel_queries() if title == "Stuck jobs")
    _, rows = run(expand(sql, **six_hours(), variables={"queue": ["reports"]}))
    assert {row[1] for row in rows} == {"reports"}


def test_the_schedules_panel_puts_late_schedules_first(busy_system) -> None:
    sql = next(sql for title, sql, _ in panel_queries() if title == "Schedules")
    columns, rows = run(expand(sql, **six_hours(), variables=ALL_QUEUES))
    schedules = {row[0]: dict(zip(columns, row, strict=True)) for row in rows}
    assert list(schedules) == ["late-report", "on-time", "paused"]
    assert 590 <= schedules["late-report"]["late_seconds"] <= 900
    assert schedules["on-time"]["late_seconds"] == 0
    assert schedules["on-time"]["last_job_id"] == busy_system["late"].pk
    assert schedules["paused"]["paused"] and not schedules["late-report"]["paused"]
    assert not any(s["removed_from_code"] for s in schedules.values())


def test_the_documented_read_only_role_can_run_every_panel_but_not_read_tables(
    busy_system,
) -> None:
    # Everything here runs in the test's transaction, which is rolled back: the role too.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        if not cursor.fetchone()[0]:
            pytest.skip("the test database user may not create roles")
        cursor.execute("SELECT current_database()")
        database = cursor.fetchone()[0]
    role = f"grafana_jobs_test_{connection.connection.info.backend_pid}"
    setup = read_only_role_sql().replace("grafana_jobs", role)
    setup = setup.replace("DATABASE app", f'DATABASE "{database}"')
    with connection.cursor() as cursor:
        cursor.execute(setup)
        cursor.execute(f"SET ROLE {role}")
        try:
            for title, sql, _ in panel_queries():
                cursor.execute(expand(sql, **six_hours(), variables=ALL_QUEUES))
                assert cursor.fetchall(), title
            tables = ("job", "attempt", "worker", "schedule", "schedule_tick")
            for table in (f"django_jobs_{name}" for name in tables):
                cursor.execute("SAVEPOINT denied")
                with pytest.raises(ProgrammingError, match="permission denied"):
                    cursor.execute(f"SELECT 1 FROM {table} LIMIT 1")
                cursor.execute("ROLLBACK TO SAVEPOINT denied")
        finally:
            cursor.execute("RESET ROLE")
