"""``job_overdue``'s p95 baseline from the hourly rollups.

A task with no expected duration is judged against the p95 run time of its successful attempts
over the last 7 days, read from ``django_jobs_rollup`` (``rollup_task_outcome_hour_idx``: the
task's successful hours, 168 rows at most per queue, summed bucket by bucket, the percentile
interpolated inside its bucket as ``django_jobs.rollups.percentile`` does), when those hours
hold at least 20 of them. Only
otherwise, for a new task or before the first rollups, is it judged as before: against its
successful jobs among its 1,000 newest (1,000 primary-key reads per task with a job running
past the floor, which cost most of the view at a million jobs). The view keeps its columns.
"""

import importlib

from django.db import migrations

from django_jobs.rollups import DURATION_BOUNDS

alerts = importlib.import_module("django_jobs.migrations.0022_alerts")

OLD_BASELINES = """baselines AS (
    SELECT c.task, b.p95, b.runs
    FROM (
        SELECT DISTINCT r.task FROM running r, settings s
        WHERE r.expected IS NULL AND r.running_seconds > s.min_seconds
          AND s.p95_factor < 'Infinity'
    ) c
    CROSS JOIN LATERAL (
        SELECT percentile_cont(0.95) WITHIN GROUP (
                   ORDER BY extract(epoch FROM d.finished_at - d.started_at))::float8 AS p95,
               count(*) AS runs
        FROM (
            SELECT i.id FROM django_jobs_job i WHERE i.task = c.task ORDER BY i.id DESC LIMIT 1000
        ) newest
        JOIN django_jobs_job d ON d.id = newest.id
        WHERE d.state = 'done' AND d.started_at IS NOT NULL
    ) b
    WHERE b.runs >= 20
),"""

#: The duration buckets' bounds, as the rollups store them (never changed once written).
BOUNDS = "ARRAY[" + ", ".join(f"{bound}" for bound in DURATION_BOUNDS) + "]::float8[]"

#: The hours' buckets summed position by position in one pass (an aggregate per position: no
#: unnest of every hour's array).
SUMS = (
    "ARRAY["
    + ", ".join(f"sum(h.duration_buckets[{i}])" for i in range(1, len(DURATION_BOUNDS) + 2))
    + "]"
)

NEW_BASELINES = f"""baselines AS MATERIALIZED (
    -- Once per task, whatever the number of its running jobs (inlined, the planner may read it
    -- again for each running job).
    SELECT c.task, coalesce(h.p95, b.p95) AS p95, coalesce(h.runs, b.runs) AS runs,
           CASE WHEN h.runs IS NOT NULL THEN 'rollups' ELSE 'newest' END AS source
    FROM (
        SELECT DISTINCT r.task FROM running r, settings s
        WHERE r.expected IS NULL AND r.running_seconds > s.min_seconds
          AND s.p95_factor < 'Infinity'
    ) c
    -- The rollups of the last 7 days: the task's successful attempts per duration bucket, the
    -- p95 interpolated inside the bucket it falls in (the last, open bucket: its lower bound).
    LEFT JOIN LATERAL (
        SELECT p.total::bigint AS runs,
               CASE WHEN p.i > cardinality({BOUNDS}) THEN ({BOUNDS})[cardinality({BOUNDS})]
                    ELSE coalesce(({BOUNDS})[p.i - 1], 0)
                         + (({BOUNDS})[p.i] - coalesce(({BOUNDS})[p.i - 1], 0))
                           * (0.95 * p.total - (p.cum - p.n)) / p.n
               END AS p95
        FROM (
            SELECT per.i, per.n, sum(per.n) OVER (ORDER BY per.i) AS cum,
                   sum(per.n) OVER () AS total
            FROM (
                SELECT {SUMS}::float8[] AS sums
                FROM django_jobs_rollup h
                WHERE h.task = c.task AND h.outcome = 'done'
                  AND h.hour >= now() - interval '7 days'
            ) s
            CROSS JOIN LATERAL unnest(s.sums) WITH ORDINALITY AS per (n, i)
        ) p
        WHERE p.n > 0 AND p.cum >= 0.95 * p.total AND p.total >= 20
        ORDER BY p.i LIMIT 1
    ) h ON true
    -- Otherwise its successful jobs among its 1,000 newest: the ids from an index-only read of
    -- job_admin_task_idx, then the rows by primary key (read only when the rollups had none).
    LEFT JOIN LATERAL (
        SELECT percentile_cont(0.95) WITHIN GROUP (
                   ORDER BY extract(epoch FROM d.finished_at - d.started_at))::float8 AS p95,
               count(*) AS runs
        FROM (
            SELECT i.id FROM django_jobs_job i
            WHERE i.task = c.task AND h.runs IS NULL
            ORDER BY i.id DESC LIMIT 1000
        ) newest
        JOIN django_jobs_job d ON d.id = newest.id
        WHERE d.state = 'done' AND d.started_at IS NOT NULL
        HAVING count(*) >= 20
    ) b ON true
    WHERE h.runs IS NOT NULL OR b.runs IS NOT NULL
),"""

OLD_DETAIL = """|| ' over the last ' || o.runs || ' successful runs of its task, and at '"""
NEW_DETAIL = """|| CASE WHEN o.source = 'rollups'
                         THEN ' over the ' || o.runs || ' successful runs of its task in the '
                              || 'last 7 days, and at '
                         ELSE ' over the last ' || o.runs || ' successful runs of its task, '
                              || 'and at ' END"""
OLD_OVERDUE = "SELECT r.*, b.p95, b.runs,"
NEW_OVERDUE = "SELECT r.*, b.p95, b.runs, b.source,"


def view(sql: str) -> str:
    for old, new in (
        (OLD_BASELINES, NEW_BASELINES),
        (OLD_DETAIL, NEW_DETAIL),
        (OLD_OVERDUE, NEW_OVERDUE),
    ):
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new)
    return sql


def replace(sql: str) -> str:
    return "DROP VIEW IF EXISTS django_jobs_alerts;\n" + sql


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0024_rollups")]

    operations = [migrations.RunSQL(replace(view(alerts.VIEW)), replace(alerts.VIEW))]
