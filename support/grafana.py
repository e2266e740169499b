"""The shipped Grafana dashboard, and its panels' SQL expanded the way Grafana expands it.

Grafana is not needed: :func:`expand` does what Grafana's PostgreSQL data source does to a
panel's SQL before sending it. First the dashboard's template variables are substituted (a
multi-value or "All" variable becomes a list of quoted SQL strings), then the global
``$__interval``, ``$__interval_ms``, ``$__unixEpochFrom()`` and ``$__unixEpochTo()``, then the
macros ``$__name(args)``, as in Grafana's ``pkg/tsdb/grafana-postgresql-datasource/macros.go``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent.parent / "grafana" / "django-jobs.json"

_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")
_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    found = []
    for panel in (dashboard or load())["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def panel_queries() -> list[tuple[str, str, str]]:
    """``(panel title, raw SQL, format)`` of every query target of every panel."""
    return [
        (panel["title"], target["rawSql"], target.get("format", "time_series"))
        for panel in panels()
        for target in panel.get("targets", [])
    ]


def _rfc3339(moment: datetime) -> str:
    # Go's time.RFC3339Nano in UTC: fractional seconds without trailing zeros, then "Z".
    moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += "." + f"{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


def _seconds(interval: str) -> float:
    match = _INTERVAL.fullmatch(interval.strip().strip("'"))
    if match is None:
        raise ValueError(f"Grafana cannot parse the interval {interval!r}")
    return float(match[1]) * _UNIT_SECONDS[match[2]]


def _number(value: float) -> str:
    # Go's %v of a float64: 60 -> "60", 0.5 -> "0.5".
    return f"{value:g}"


def _format_variable(value: str | Sequence[str], multi: bool) -> str:
    # Grafana's SQL data sources quote the values of multi-value and "All" variables.
    if isinstance(value, str) and not multi:
        return value
    values = [value] if isinstance(value, str) else list(value)
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def expand(
    sql: str,
    *,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    interval: str = "1m",
    variables: Mapping[str, str | Sequence[str]] | None = None,
    multi: Sequence[str] = ("queue",),
) -> str:
    """``sql`` as Grafana's PostgreSQL data source would run it. The time range defaults to the
    last hour; ``variables`` maps template variable names to their selected value(s)."""
    time_to = time_to or datetime.now(UTC)
    time_from = time_from or time_to - timedelta(hours=1)
    variables = {"queue": ["default"], **(variables or {})}

    def variable(match: re.Match[str]) -> str:
        name = match["braced"] or match["bracket"] or match["plain"]
        if name not in variables:
            return match[0]
        return _format_variable(variables[name], name in multi)

    sql = re.sub(
        r"\$\{(?P<braced>\w+)\}|\[\[(?P<bracket>\w+)\]\]|\$(?P<plain>(?!__)\w+)", variable, sql
    )

    seconds = _seconds(interval)
    sql = sql.replace("$__interval_ms", str(int(seconds * 1000)))
    sql = sql.replace("$__interval", interval)
    sql = sql.replace("$__unixEpochFrom()", str(int(time_from.timestamp())))
    sql = sql.replace("$__unixEpochTo()", str(int(time_to.timestamp())))

    def macro(match: re.Match[str]) -> str:
        name = match[1]
        args = [arg.strip() for arg in match[2].split(",")]
        if name == "__time":
            return f'{args[0]} AS "time"'
        if name == "__timeEpoch":
            return f'extract(epoch from {args[0]}) as "time"'
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{_rfc3339(time_from)}' AND '{_rfc3339(time_to)}'"
        if name == "__timeFrom":
            return f"'{_rfc3339(time_from)}'"
        if name == "__timeTo":
            return f"'{_rfc3339(time_to)}'"
        if name in ("__timeGroup", "__timeGroupAlias"):
            if len(args) < 2:
                raise ValueError(f"${name} needs a time column and an interval")
            step = _number(_seconds(args[1]))
            group = f"floor(extract(epoch from {args[0]})/{step})*{step}"
            return group + (' AS "time"' if name == "__timeGroupAlias" else "")
        if name == "__unixEpochFilter":
            return (
                f"{args[0]} >= {int(time_from.timestamp())} AND "
                f"{args[0]} <= {int(time_to.timestamp())}"
            )
        raise ValueError(f"unknown macro ${name}")

    return _MACRO.sub(macro, sql)
