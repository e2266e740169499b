#!/usr/bin/env python3
"""What a Prometheus scrape of ``django_jobs.metrics`` costs on a large job table, and how big
the rollups grow.

    .venv/bin/python bench/metrics_cost.py                  # 1,000,000 jobs in metrics_1m
    .venv/bin/python bench/metrics_cost.py --jobs 3000000 --database-url postgres://.../m3m

It creates the database if needed, migrates it, fills it once with a month of history ending
now (support/history.py: 12 tasks in 5 queues, a live edge of 20,000 pending jobs), then:

- times the rollup of the whole month (``manage.py rollupjobs``' function), and an hour's pass;
- times whole scrapes through the view (access check, the reads, rendering), the median of
  ``--runs``, with the rollups' watermark where a worker keeps it (the last closed hour), and,
  for comparison, the reads' cost without the rollups (every finish read from the job table);
- prints the rollups' rows and bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/metrics_1m"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="total jobs (default 1M)")
    parser.add_argument("--refill", action="store_true", help="delete and refill the data")
    parser.add_argument("--runs", type=int, default=20, help="scrapes timed (median reported)")
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
                "django_jobs_step, django_jobs_job, django_jobs_rollup, django_jobs_rollup_total, "
                "django_jobs_rollup_state RESTART IDENTITY"
            )
            started = time.monotonic()
            fill_history(cursor, finished=args.jobs - 23_040)
            print(f"filled in {time.monotonic() - started:.0f}s", file=sys.stderr)
            cursor.execute("VACUUM ANALYZE")
        jobs, attempts = cursor.execute(
            "SELECT (SELECT count(*) FROM django_jobs_job), "
            "(SELECT count(*) FROM django_jobs_attempt)"
        ).fetchone()

    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import override_settings, setup_test_environment

    from django_jobs import rollups
    from django_jobs.metrics import collect

    setup_test_environment()
    print(f"{jobs:,} jobs, {attempts:,} attempts ({args.database_url.rsplit('/', 1)[1]})\n")

    def timed_reads(label: str) -> float:
        collect.read()  # warm the connection and the plans
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            collect.read()
            times.append((time.perf_counter() - started) * 1000)
        ms = statistics.median(times)
        print(f"| {label:<58} | {ms:>9.1f} |")
        return ms

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_jobs_rollup_state")
        cursor.execute("TRUNCATE django_jobs_rollup, django_jobs_rollup_total")
    print(f"| {'step':<58} | {'ms':>9} |")
    print(f"|{'-' * 60}|{'-' * 11}|")
    runs, args.runs = args.runs, 3
    timed_reads("scrape reads, no rollups (every finish from the job table)")
    args.runs = runs
    started = time.perf_counter()
    result = rollups.roll_up()
    print(f"| {'roll up the month (' + str(result.passes) + ' passes)':<58} | "
          f"{(time.perf_counter() - started) * 1000:>9.1f} |")  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_rollup_state SET rolled_until = rolled_until - interval '1 hour'"
        )
        cursor.execute(
            "DELETE FROM django_jobs_rollup WHERE hour >= "
            "(SELECT rolled_until FROM django_jobs_rollup_state)"
        )
        # The totals keep that hour: the pass below adds it again, which only this measure does.
        started = time.perf_counter()
        rollups.roll_up_once(cursor, span=timedelta(hours=1))
        hour_ms = (time.perf_counter() - started) * 1000
    print(f"| {'roll up one hour (a worker pass)':<58} | {hour_ms:>9.1f} |")
    reads_ms = timed_reads("scrape reads, rollups up to the last closed hour")

    client = Client()
    with override_settings(JOBS_METRICS_ALLOWED_IPS=["127.0.0.1"]):
        response = client.get("/metrics/")
        assert response.status_code == 200, response.content
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            response = client.get("/metrics/")
            times.append((time.perf_counter() - started) * 1000)
    scrape_ms = statistics.median(times)
    print(f"| {'whole scrape (GET /metrics/: access, reads, render)':<58} | {scrape_ms:>9.1f} |")
    lines = response.content.decode().count("\n")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM django_jobs_rollup), "
            "pg_total_relation_size('django_jobs_rollup'), "
            "(SELECT count(*) FROM django_jobs_rollup_total), "
            "pg_total_relation_size('django_jobs_rollup_total'), "
            "(SELECT count(DISTINCT hour) FROM django_jobs_rollup)"
        )
        rows, size, totals, totals_size, hours = cursor.fetchone()
    print(
        f"\nscrape: {scrape_ms:.1f} ms median of {args.runs} ({reads_ms:.1f} ms of it reading), "
        f"{len(response.content):,} bytes, {lines:,} lines"
    )
    print(
        f"rollups: {rows:,} hourly rows over {hours} hours, {size / 1e6:.1f} MB with indexes; "
        f"totals: {totals} rows, {totals_size / 1e3:.0f} kB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
