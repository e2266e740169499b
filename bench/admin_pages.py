"""Admin pages at 1,000,000 jobs: the changelist (unfiltered, each filter, searches, a deep
page) and a job's page, then the schedules' list and a schedule's page (50 schedules, whose last
jobs are among the million), rendered by Django's test client against a filled database.

    python bench/admin_pages.py [--rows 1000000] [--repeat 7]

Prints the median and the worst time of each page in milliseconds. The database
(``bench_admin``, or ``DATABASE_URL``) is filled once and reused while it has enough rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
URL = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_admin")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

# A realistic table: mostly finished jobs over two weeks, a few thousand failed or cancelled,
# a backlog of pending and waiting jobs, some running.
FILL = """
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, attempt, max_attempts,
                             run_after, worker_id, created_at, started_at, finished_at, error)
SELECT 'app.tasks.task_' || (g %% 30),
       (ARRAY['default', 'reports', 'imports'])[1 + g %% 3],
       (g %% 5) - 2,
       s.state,
       '[1, "two"]', '{"report_id": 7}',
       CASE WHEN s.state IN ('pending', 'waiting') THEN 0 ELSE 1 END,
       3,
       c.at,
       CASE WHEN s.state IN ('pending', 'waiting') THEN NULL
            ELSE 'jobs-worker-' || (g %% 40) || ':1:abcdef' END,
       c.at,
       CASE WHEN s.state IN ('pending', 'waiting') THEN NULL ELSE c.at + interval '1 second' END,
       CASE WHEN s.state IN ('done', 'error', 'cancelled') THEN c.at + interval '30 seconds' END,
       CASE WHEN s.state = 'error' THEN 'ValueError: broken feed ' || g ELSE '' END
FROM generate_series(1, %(rows)s) g,
     LATERAL (SELECT CASE WHEN g %% 1000 < 940 THEN 'done'
                          WHEN g %% 1000 < 960 THEN 'error'
                          WHEN g %% 1000 < 970 THEN 'cancelled'
                          WHEN g %% 1000 < 990 THEN 'pending'
                          WHEN g %% 1000 < 995 THEN 'waiting'
                          ELSE 'running' END AS state) s,
     LATERAL (SELECT now() - make_interval(secs => (%(rows)s - g) * 1.2) AS at) c
"""

PAGES = [
    ("unfiltered", ""),
    ("state = error", "?state=error"),
    ("state = done", "?state=done"),
    ("state = pending (ready now)", "?state=pending"),
    ("state = scheduled", "?state=scheduled"),
    ("state = waiting", "?state=waiting"),
    ("state = running", "?state=running"),
    ("state = cancelled", "?state=cancelled"),
    ("queue = reports", "?queue=reports"),
    ("task = app.tasks.task_7", "?task=app.tasks.task_7"),
    ("created in the last hour", "?created=1h"),
    ("search: task prefix", "?q=app.tasks.task_2"),
    ("search: exact id", "?q=777777"),
    ("search: worker id", "?q=jobs-worker-17:"),
    ("search: unique key", "?q=no-such-key"),
    ("search: argument, many match", "?q=report_id=7"),
    ("search: argument, none match", "?q=report_id=8"),
    ("search: argument string, none match", '?q=name="nobody"'),
    ("search: argument within errors", "?state=error&q=report_id=7"),
    ("page 2,000", "?p=2000"),
    ("errors, page 50", "?state=error&p=50"),
]

#: The schedules' pages, with :data:`SCHEDULES` schedules (their last jobs among the 1M).
SCHEDULE_PAGES = [
    ("schedules: list", ""),
    ("schedules: paused", "?paused__exact=1"),
    ("schedules: search", "?q=report"),
]
SCHEDULES = 50
#: The shapes of the bench's schedules, each in its own zone.
SCHEDULE_SHAPES = [
    ("30 6 * * mon-fri", "Europe/Paris"),
    ("*/15 * * * *", "UTC"),
    ("0 9 1 * *", "America/New_York"),
    ("@weekly", "Asia/Tokyo"),
    ("0 0 L * *", "UTC"),
]


def prepare(rows: int) -> None:
    from urllib.parse import urlsplit

    import psycopg

    from bench.core import ensure_migrated

    parts = urlsplit(URL)
    base = f"host={parts.hostname} port={parts.port or 5432} user={parts.username}"
    ensure_migrated(URL)
    with psycopg.connect(f"{base} dbname={parts.path[1:]}", autocommit=True) as conn:
        have = conn.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0]
        if have < rows:
            print(f"filling {rows:,} jobs ...", flush=True)
            conn.execute(
                "TRUNCATE django_jobs_job, django_jobs_attempt, django_jobs_dependency,"
                " django_jobs_step"
            )
            conn.execute(FILL, {"rows": rows})
            conn.execute(
                "INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at,"
                " finished_at, outcome, error, traceback)"
                " SELECT id, 1, worker_id, started_at, finished_at,"
                " CASE state WHEN 'running' THEN 'running' WHEN 'done' THEN 'done'"
                " WHEN 'cancelled' THEN 'cancelled' ELSE 'error' END, error, ''"
                " FROM django_jobs_job WHERE worker_id IS NOT NULL"
            )
        conn.execute("VACUUM ANALYZE django_jobs_job")
        conn.execute("VACUUM ANALYZE django_jobs_attempt")


def make_schedules() -> int:
    """:data:`SCHEDULES` schedules, made once; returns the id of one whose last run failed."""
    from django_jobs.models import Job, Schedule

    failed = list(Job.objects.filter(state="error").values_list("pk", flat=True)[:SCHEDULES])
    for i in range(Schedule.objects.count(), SCHEDULES):
        expression, zone = SCHEDULE_SHAPES[i % len(SCHEDULE_SHAPES)]
        schedule = Schedule.objects.create(
            name=f"app.report-{i:02}-for-the-partner-accounting-export",
            task=f"app.tasks.task_{i % 30}",
            cron=expression,
            timezone=zone,
            paused=i % 10 == 0,
            last_job_id=failed[i % len(failed)],
            last_run_at=Job.objects.get(pk=failed[i % len(failed)]).created_at,
            last_outcome="error: ValueError: broken feed",
        )
        schedule.recompute_next_run()
    return Schedule.objects.order_by("pk").values_list("pk", flat=True)[0]


def time_schedule_pages(client: Any, repeat: int) -> None:
    """Print the rows of :data:`SCHEDULE_PAGES` and a schedule's page, after the job pages'."""
    schedule_id = make_schedules()
    pages = [*SCHEDULE_PAGES, ("schedules: a schedule's page", f"{schedule_id}/change/")]
    for label, query in pages:
        time_page(client, label, "/admin/django_jobs/schedule/" + query, repeat)


#: The console's other pages: the dashboard at each range of its chart, queues, API tokens.
CONSOLE_PAGES = [
    ("dashboard, 1 h", "/admin/django_jobs/dashboard/?range=1h"),
    ("dashboard, 24 h", "/admin/django_jobs/dashboard/?range=24h"),
    ("dashboard, 7 d", "/admin/django_jobs/dashboard/?range=7d"),
    ("queues", "/admin/django_jobs/queue/"),
    ("API tokens", "/admin/django_jobs/apitoken/"),
]


def time_page(client: Any, label: str, url: str, repeat: int) -> None:
    """Print a table row: the page's median and worst time over ``repeat`` loads, and the rows
    its list shows (1 for a page without a list)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    context = response.context or {}
    shown = len(context["cl"].result_list) if "cl" in context else 1
    print(f"| {label} | {statistics.median(times):.0f} | {max(times):.0f} | {shown} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    prepare(args.rows)

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_test_environment

    from django_jobs.models import Job

    setup_test_environment()
    user, _ = User.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    job_id = Job.objects.filter(state="error").values_list("pk", flat=True).first()
    pages = [*PAGES, ("job page", f"{job_id}/change/")]
    print(f"| page ({args.rows:,} jobs) | median ms | worst ms | rows shown |")
    print("|---|---|---|---|")
    for label, query in pages:
        time_page(client, label, "/admin/django_jobs/job/" + query, args.repeat)
    for label, url in CONSOLE_PAGES:
        time_page(client, label, url, args.repeat)
    time_schedule_pages(client, args.repeat)


if __name__ == "__main__":
    main()
