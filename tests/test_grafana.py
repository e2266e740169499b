"""The shipped Grafana dashboard: every panel's SQL, expanded as Grafana would, runs against a
database with realistic data and returns the columns its panel expects."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.utils import ProgrammingError

from tests.conftest import ROOT
from tests.grafana import expand, load, panel_queries, panels

# The columns each panel's query must return, in order.
EXPECTED_COLUMNS = {
    "Backlog per queue": ["queue", "ready", "scheduled", "waiting", "running"],
    "Oldest ready job": ["queue", "oldest_ready_seconds"],
    "Workers alive": ["alive", "dead", "busy_slots", "slots"],
    "Throughput: attempts done per minute": ["time", "metric", "done_per_minute"],
    "Failure rate": ["time", "metric", "failure_rate"],
    "Failures per minute by task": ["time", "metric", "failed_per_minute"],
    "Duration percentiles (successful attempts, last hour)": [
        "task",
        "queue",
        "attempts",
        "p50",
        "p95",
        "max",
    ],
    "Stuck jobs": [
        "job_id",
        "queue",
        "task",
        "reason",
        "state",
        "worker_id",
        "attempt",
        "max_attempts",
        "since",
        "age_seconds",
    ],
    "Recent failures": [
        "time",
        "job_id",
        "queue",
        "task",
        "attempt",
        "max_attempts",
        "outcome",
        "job_state",
        "worker_id",
        "duration_seconds",
        "error",
    ],
    "Workers": [
        "worker_id",
        "host",
        "alive",
        "seen_seconds_ago",
        "running_jobs",
        "concurrency",
        "queues",
        "started_at",
    ],
}


def six_hours() -> dict[str, datetime]:
    """The dashboard's default time range, ending now: taken when a test runs, since the test
    data is made relative to the database's clock then (a long suite runs minutes after it
    collected this module)."""
    now = datetime.now(UTC)
    return {"time_from": now - timedelta(hours=6), "time_to": now + timedelta(minutes=1)}


ALL_QUEUES = {"queue": ["default", "reports", "imports"]}


def run(sql: str) -> tuple[list[str], list[tuple]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [c[0] for c in cursor.description], cursor.fetchall()


def test_expansion_follows_grafanas_postgres_macros() -> None:
    start = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)
    end = datetime(2026, 11, 30, 7, 0, 0, 250000, tzinfo=UTC)
    sql = (
        "SELECT $__timeGroupAlias(minute, $__interval), $__interval_ms, $__timeFrom(), "
        "$__timeTo() FROM t WHERE $__timeFilter(minute) AND queue IN ($queue) "
        "AND x = '${single}'"
    )
    assert expand(
        sql,
        time_from=start,
        time_to=end,
        interval="5m",
        variables={"queue": ["a", "o'b"], "single": "one"},
    ) == (
        'SELECT floor(extract(epoch from minute)/300)*300 AS "time", 300000, '
        "'2026-11-30T01:00:00Z', '2026-11-30T07:00:00.25Z' FROM t WHERE minute BETWEEN "
        "'2026-11-30T01:00:00Z' AND '2026-11-30T07:00:00.25Z' AND queue IN ('a','o''b') "
        "AND x = 'one'"
    )
    with pytest.raises(ValueError, match="unknown macro"):
        expand("SELECT $__nonsense(x)")


def test_the_dashboard_picks_its_postgres_data_source_from_a_variable() -> None:
    dashboard = load()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "grafana-postgresql-datasource"
    assert variables["queue"]["multi"] and variables["queue"]["includeAll"]
    wanted = {"type": "grafana-postgresql-datasource", "uid": "${datasource}"}
    assert variables["queue"]["datasource"] == wanted
    for panel in panels(dashboard):
        assert panel["datasource"] == wanted, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == wanted and target["rawQuery"], panel["title"]
    assert "__inputs" not in dashboard  # nothing to map at import time
    assert dashboard["uid"] == "django-jobs"


def test_the_panels_cover_what_operators_watch() -> None:
    titles = [title for title, _, _ in panel_queries()]
    assert sorted(titles) == sorted(EXPECTED_COLUMNS)
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("title", "sql", "fmt"), panel_queries(), ids=[q[0] for q in panel_queries()]
)
def test_each_panel_query_returns_rows_with_its_columns(busy_queues, title, sql, fmt) -> None:
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


def read_only_role_sql() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### A read-only role for Grafana", 1)[1]
    return re.search(r"```sql\n(.*?)```", section, re.S)[1]


def test_the_documented_read_only_role_can_run_every_panel_but_not_read_tables(
    busy_queues,
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
            for table in ("django_jobs_job", "django_jobs_attempt", "django_jobs_worker"):
                cursor.execute("SAVEPOINT denied")
                with pytest.raises(ProgrammingError, match="permission denied"):
                    cursor.execute(f"SELECT 1 FROM {table} LIMIT 1")
                cursor.execute("ROLLBACK TO SAVEPOINT denied")
        finally:
            cursor.execute("RESET ROLE")
