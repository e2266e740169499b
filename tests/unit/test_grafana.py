"""The Grafana dashboard's file: its macros, data source and panels, read without a database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from support.grafana import expand, load, panel_queries, panels
from tests.unit.helpers import EXPECTED_COLUMNS


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
