#!/usr/bin/env python3
"""Render the Grafana dashboard's panels with matplotlib, from the panels' own SQL.

    python bench/dashboard_preview.py --database-url postgres://postgres@127.0.0.1:5432/ops_views_1m

This is not Grafana: it runs each panel query of ``grafana/django-jobs.json``, expanded as
Grafana would (``support/grafana.py``, last 6 hours, every queue), and draws the rows in the
dashboard's layout, so the panels can be seen without a Grafana server. It needs matplotlib
and psycopg, which are not dependencies of django-jobs: use any Python with both installed. The
database should hold data worth drawing, e.g. the one ``bench/views_cost.py`` fills.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support.grafana import expand, load, panels  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/ops_views_1m"
NOTE = (
    "Rendered with matplotlib from the rows that the dashboard's SQL returns "
    "(last 6 hours, all queues, 5-minute buckets). Not a Grafana screenshot."
)


def fetch(conn: Any, sql: str) -> tuple[list[str], list[tuple]]:
    cursor = conn.execute(sql)
    return [c.name for c in cursor.description], cursor.fetchall()


def series(rows: list[tuple]) -> dict[str, tuple[list[datetime], list[float]]]:
    found: dict[str, tuple[list[datetime], list[float]]] = {}
    for epoch, metric, value in rows:
        times, values = found.setdefault(metric, ([], []))
        times.append(datetime.fromtimestamp(float(epoch), UTC))
        values.append(float(value or 0))
    return found


def draw_table(ax: Any, columns: list[str], rows: list[tuple], limit: int = 8) -> None:
    ax.axis("off")
    cells = []
    for row in rows[:limit]:
        cells.append([_cell(value) for value in row])
    if not cells:
        ax.text(0.5, 0.5, "no rows", ha="center", va="center", color="grey")
        return
    table = ax.table(cellText=cells, colLabels=columns, loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1, 1.25)
    for (row, _), cell in table.get_celld().items():
        cell.set_edgecolor("#dddddd")
        if row == 0:
            cell.set_facecolor("#eef2f7")
            cell.set_text_props(weight="bold")


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S")
    if isinstance(value, float):
        return f"{value:,.1f}"
    text = str(value)
    return text if len(text) <= 28 else text[:27] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "dashboard-preview.png")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import psycopg

    dashboard = load()
    queue_query = next(v for v in dashboard["templating"]["list"] if v["name"] == "queue")
    end = datetime.now(UTC)
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        queues = [row[0] for row in conn.execute(queue_query["query"]).fetchall()]
        results = {}
        for panel in panels(dashboard):
            sql = expand(
                panel["targets"][0]["rawSql"],
                time_from=end - timedelta(hours=6),
                time_to=end,
                interval="5m",
                variables={"queue": queues},
            )
            results[panel["title"]] = fetch(conn, sql)

    fig = plt.figure(figsize=(16, 19))
    grid = fig.add_gridspec(
        6, 24, hspace=0.6, wspace=2.5, top=0.93, bottom=0.02, height_ratios=[1, 1, 1, 0.8, 1.3, 0.9]
    )
    fig.suptitle(
        "django-jobs dashboard: panel preview", fontsize=16, weight="bold", x=0.02, ha="left"
    )
    fig.text(0.02, 0.948, NOTE, fontsize=10, color="#b03a2e", ha="left")
    axes = {
        "Backlog per queue": fig.add_subplot(grid[0, 0:12]),
        "Oldest ready job": fig.add_subplot(grid[0, 12:18]),
        "Workers alive": fig.add_subplot(grid[0, 18:24]),
        "Throughput: attempts done per minute": fig.add_subplot(grid[1, 0:12]),
        "Failure rate": fig.add_subplot(grid[1, 12:24]),
        "Failures per minute by task": fig.add_subplot(grid[2, 0:12]),
        "Duration percentiles (successful attempts, last hour)": fig.add_subplot(grid[2, 12:24]),
        "Stuck jobs": fig.add_subplot(grid[3, 0:24]),
        "Recent failures": fig.add_subplot(grid[4, 0:24]),
        "Workers": fig.add_subplot(grid[5, 0:24]),
    }
    for title, ax in axes.items():
        ax.set_title(title, loc="left", fontsize=11, weight="bold")
        columns, rows = results[title]
        if title == "Backlog per queue":
            names = [r[0] for r in rows]
            left = [0.0] * len(rows)
            for i, column in enumerate(columns[1:], start=1):
                values = [float(r[i]) for r in rows]
                ax.barh(names, values, left=left, label=column)
                left = [a + b for a, b in zip(left, values, strict=True)]
            ax.legend(fontsize=8, ncols=2, loc="lower right")
            ax.invert_yaxis()
            ax.set_xlabel("jobs")
        elif title == "Oldest ready job":
            minutes = [float(r[1]) / 60 for r in rows]
            colors = ["#c0392b" if m >= 15 else "#e67e22" if m >= 5 else "#27ae60" for m in minutes]
            ax.barh([r[0] for r in rows], minutes, color=colors)
            for y, m in enumerate(minutes):
                ax.text(m, y, f" {m:.0f} min", va="center", fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("minutes since ready")
        elif title == "Workers alive":
            ax.axis("off")
            for i, (name, value) in enumerate(zip(columns, rows[0], strict=True)):
                color = "#c0392b" if name == "dead" and value else "#27ae60"
                ax.text(
                    0.25 + (i % 2) * 0.5,
                    0.7 - (i // 2) * 0.5,
                    str(value),
                    fontsize=26,
                    ha="center",
                    color=color,
                    weight="bold",
                    transform=ax.transAxes,
                )
                ax.text(
                    0.25 + (i % 2) * 0.5,
                    0.55 - (i // 2) * 0.5,
                    name,
                    fontsize=9,
                    ha="center",
                    transform=ax.transAxes,
                )
        elif title in (
            "Throughput: attempts done per minute",
            "Failure rate",
            "Failures per minute by task",
        ):
            for metric, (times, values) in sorted(series(rows).items()):
                if title == "Failures per minute by task":
                    ax.bar(times, values, width=0.003, label=metric, alpha=0.7)
                else:
                    ax.plot(times, values, label=metric, linewidth=1.2)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
            ax.legend(fontsize=7, ncols=3, loc="upper left")
            if title == "Failure rate":
                ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
            ax.grid(alpha=0.3)
        else:
            draw_table(ax, columns, rows, limit={"Recent failures": 12}.get(title, 8))
    for ax in fig.axes:
        for spine in ax.spines.values():
            spine.set_color("#cccccc")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=90)
    print(textwrap.fill(f"wrote {args.output}: {NOTE}", 100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
