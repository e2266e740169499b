#!/usr/bin/env python3
"""What each operations view costs on a large job table: ``EXPLAIN ANALYZE`` times.

    python bench/views_cost.py                       # 1,000,000 jobs in database ops_views_1m
    python bench/views_cost.py --jobs 200000 --database-url postgres://.../mydb

It creates the database if needed, migrates it, fills it once with a month of realistic
history (see :func:`fill_history`), then runs every view and every Grafana panel query a few
times under ``EXPLAIN (ANALYZE, BUFFERS)`` and prints the median execution time and the plan's
top node. Run it with the project's virtualenv (``.venv/bin/python``). ``--refill`` rebuilds
the data.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/ops_views_1m"

VIEWS = [
    "django_jobs_queue_summary",
    "django_jobs_throughput",
    "django_jobs_task_durations",
    "django_jobs_workers",
    "django_jobs_stuck_jobs",
    "django_jobs_recent_failures",
    "django_jobs_alerts",
]


def queries() -> list[tuple[str, str]]:
    """Every view as a whole, plus the queries people typically run against them."""
    found = [(name, f"SELECT * FROM {name}") for name in VIEWS]
    found += [
        (
            "throughput, last hour",
            "SELECT * FROM django_jobs_throughput WHERE minute >= now() - interval '1 hour'",
        ),
        (
            "recent failures, newest 50",
            "SELECT * FROM django_jobs_recent_failures ORDER BY finished_at DESC LIMIT 50",
        ),
    ]
    return found


def dashboard_queries(cursor: Any) -> list[tuple[str, str]]:
    """The Grafana dashboard's panel queries, expanded as Grafana would with its default time
    range (the last 6 hours) and every queue selected."""
    from support.grafana import expand, load, panel_queries

    variable = next(v for v in load()["templating"]["list"] if v["name"] == "queue")
    queues = [row[0] for row in cursor.execute(variable["query"]).fetchall()]
    end = datetime.now(UTC)
    return [
        (
            f"panel: {title}",
            expand(
                sql, time_from=end - timedelta(hours=6), time_to=end, variables={"queue": queues}
            ),
        )
        for title, sql, _ in panel_queries()
    ]


def explain(cursor: Any, sql: str, runs: int) -> tuple[float, str]:
    times = []
    top = ""
    for _ in range(runs):
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0][0]
        times.append(plan["Execution Time"] + plan["Planning Time"])
        top = plan["Plan"]["Node Type"]
    return statistics.median(times), top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="total jobs (default 1M)")
    parser.add_argument("--refill", action="store_true", help="delete and refill the data")
    parser.add_argument("--runs", type=int, default=5, help="runs per query (median reported)")
    parser.add_argument("--plans", action="store_true", help="print each query's full plan")
    args = parser.parse_args(argv)

    import psycopg

    sys.path.insert(0, str(ROOT))
    from bench.core import ensure_migrated
    from support.history import fill_history

    ensure_migrated(args.database_url, "testproject.settings")
    with psycopg.connect(args.database_url, autocommit=True) as conn, conn.cursor() as cursor:
        count = cursor.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0]
        if args.refill or count == 0:
            cursor.execute(
                "TRUNCATE django_jobs_attempt, django_jobs_dependency, django_jobs_worker, "
                "django_jobs_step, django_jobs_job RESTART IDENTITY"
            )
            started = time.monotonic()
            active = 20_000 + 40 + 3_000
            fill_history(cursor, finished=args.jobs - active)
            print(f"filled in {time.monotonic() - started:.0f}s", file=sys.stderr)
            cursor.execute("VACUUM ANALYZE")
        rows = cursor.execute(
            "SELECT (SELECT count(*) FROM django_jobs_job), "
            "(SELECT count(*) FROM django_jobs_attempt)"
        ).fetchone()
        print(f"{rows[0]:,} jobs, {rows[1]:,} attempts ({args.database_url.rsplit('/', 1)[1]})\n")
        print(f"| {'query':<44} | {'ms (median)':>11} | top plan node |")
        print(f"|{'-' * 46}|{'-' * 13}|---------------|")
        for label, sql in queries() + dashboard_queries(cursor):
            ms, top = explain(cursor, sql, args.runs)
            print(f"| {label[:44]:<44} | {ms:>11.2f} | {top} |")
            if args.plans:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                print("\n".join(r[0] for r in cursor.fetchall()), "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
