"""Alerts for what did not happen: the ``django_jobs_alerts`` view, and the table of its
thresholds.

The view is part of the operations contract (docs/operations.md): one row per firing condition,
with its kind, subject, since when, what is wrong and how bad. Its thresholds live in Python
(``JOBS_ALERTS``, ``@job(expected_duration=...)``) and reach it through
``django_jobs_alert_threshold``, which django_jobs/alerts.py keeps in sync; a threshold without a
row has ``JOBS_ALERTS``' default, written here. The view reads only the rows it reports on:
running jobs through ``job_running_worker_idx``, the head of each queue and priority of
``job_claim_free_queue_idx``, failed attempts of the last two windows through
``attempt_failed_idx``, a schedule's ticks since its last success through
``schedule_tick_once``, and a task's newest jobs through ``job_admin_task_idx``.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

#: The subject of a threshold that holds for every schedule or queue not named.
EVERY = "'*'"


def threshold(kind: str, subject: str | None, default: str | None) -> str:
    """SQL for a threshold: the row of ``subject`` (an SQL expression), else the row for every
    subject, else ``default``."""
    lookup = (
        "(SELECT t.value FROM django_jobs_alert_threshold t"
        f" WHERE t.kind = '{kind}' AND t.subject = {{subject}})"
    )
    found = [lookup.format(subject=subject)] if subject is not None else []
    if default is not None:
        found += [lookup.format(subject=EVERY), default]
    return found[0] if len(found) == 1 else f"coalesce({', '.join(found)})"


def utc(expression: str) -> str:
    """SQL text of a timestamptz, in UTC to the second."""
    return f"to_char({expression} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'"


def seconds(expression: str) -> str:
    """SQL text of a number of seconds, rounded."""
    return f"round(({expression})::numeric) || ' s'"


VIEW = f"""
CREATE VIEW django_jobs_alerts AS
WITH RECURSIVE
settings AS (
    SELECT {threshold("overdue_p95_factor", None, "3")} AS p95_factor,
           {threshold("overdue_min_seconds", None, "300")} AS min_seconds,
           {threshold("exhausted_threshold", None, "5")} AS exhausted_threshold,
           {threshold("exhausted_window", None, "3600")} AS exhausted_window,
           django_jobs_setting('worker_timeout', 60) AS worker_timeout
),
-- The queues with pending jobs without a concurrency key: one probe of
-- job_claim_free_queue_idx per queue (a skip scan).
queues AS (
    (SELECT j.queue FROM django_jobs_job j
     WHERE j.state = 'pending' AND j.concurrency_key IS NULL
     ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM django_jobs_job j
            WHERE j.state = 'pending' AND j.concurrency_key IS NULL AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
),
-- The first job of each queue and priority in the index's order: that priority's earliest
-- run_after. One probe per queue and priority in use.
heads AS (
    SELECT q.queue, h.priority, h.run_after, h.id
    FROM queues q
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_after, j.id FROM django_jobs_job j
        WHERE j.state = 'pending' AND j.concurrency_key IS NULL AND j.queue = q.queue
        ORDER BY j.priority DESC, j.run_after, j.id LIMIT 1
    ) h
    WHERE q.queue IS NOT NULL
    UNION ALL
    SELECT p.queue, n.priority, n.run_after, n.id
    FROM heads p
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_after, j.id FROM django_jobs_job j
        WHERE j.state = 'pending' AND j.concurrency_key IS NULL AND j.queue = p.queue
          AND j.priority < p.priority
        ORDER BY j.priority DESC, j.run_after, j.id LIMIT 1
    ) n
),
-- Per queue that is not paused: its oldest ready job.
ready AS (
    SELECT DISTINCT ON (h.queue) h.queue, h.run_after AS oldest_at, h.id AS oldest_id,
           extract(epoch FROM now() - h.run_after)::float8 AS age
    FROM heads h
    LEFT JOIN django_jobs_queue c ON c.name = h.queue
    WHERE h.run_after <= now() AND NOT coalesce(c.paused, false)
    ORDER BY h.queue, h.run_after, h.id
),
running AS (
    SELECT j.id, j.task, j.queue, j.worker_id, j.started_at,
           extract(epoch FROM now() - j.started_at)::float8 AS running_seconds,
           {threshold("expected_duration", "j.task", None)} AS expected
    FROM django_jobs_job j WHERE j.state = 'running'
),
-- The p95 run time of a task's successful jobs among its 1,000 newest, for the tasks with a job
-- running past the floor and no expected duration; at least 20 runs. The ids come from an
-- index-only read of job_admin_task_idx, then the rows by primary key: 1,000 of each at most,
-- however rare the task (a walk of the primary key filtered on the task would read the whole
-- table back to its oldest job).
baselines AS (
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
),
overdue AS (
    SELECT r.*, b.p95, b.runs,
           coalesce(r.expected, CASE WHEN b.p95 IS NOT NULL
                                   THEN greatest(s.p95_factor * b.p95, s.min_seconds) END)
               AS limit_seconds,
           s.p95_factor, s.min_seconds
    FROM running r
    CROSS JOIN settings s
    LEFT JOIN baselines b ON b.task = r.task AND r.expected IS NULL
),
-- Per schedule: its last tick whose job succeeded, and the ticks after it (but those skipped
-- while that very job still ran).
schedules AS (
    SELECT s.id, s.name, s.task, s.queue, s.next_run_at, g.grace, l.fire_at AS success_at,
           l.job_id AS success_job_id, d.due, d.missed, d.missed_past_grace
    FROM django_jobs_schedule s
    CROSS JOIN LATERAL (SELECT {threshold("schedule_grace", "s.name", "600")} AS grace) g
    LEFT JOIN LATERAL (
        SELECT t.fire_at, t.job_id, j.finished_at
        FROM django_jobs_schedule_tick t
        JOIN django_jobs_job j ON j.id = t.job_id
        WHERE t.schedule_id = s.id AND j.state = 'done'
        ORDER BY t.fire_at DESC LIMIT 1
    ) l ON true
    CROSS JOIN LATERAL (
        SELECT coalesce(min(t.fire_at), s.next_run_at) AS due, count(*) AS missed,
               count(*) FILTER (WHERE extract(epoch FROM now() - t.fire_at) > g.grace)
                   AS missed_past_grace
        FROM django_jobs_schedule_tick t
        WHERE t.schedule_id = s.id AND t.fire_at > coalesce(l.fire_at, '-infinity')
          AND NOT (t.outcome = 'skipped: previous run active'
                   AND coalesce(t.fire_at < l.finished_at, false))
    ) d
    WHERE NOT s.paused AND s.missing_from_code_since IS NULL
),
-- Jobs that ended error in their last allowed attempt, per task, in the last two windows.
exhausted AS (
    SELECT j.task,
           count(*) FILTER (WHERE a.finished_at > now() - make_interval(secs => s.exhausted_window))
               AS recent,
           count(*) FILTER (WHERE a.finished_at <= now() - make_interval(secs => s.exhausted_window))
               AS before,
           min(a.finished_at) FILTER (
               WHERE a.finished_at > now() - make_interval(secs => s.exhausted_window)) AS first_at,
           s.exhausted_threshold, s.exhausted_window
    FROM settings s
    JOIN django_jobs_attempt a
      ON a.outcome IN ('crashed', 'error', 'lost', 'timeout')
     AND a.finished_at > now() - make_interval(secs => 2 * s.exhausted_window)
     -- The longest window JOBS_ALERTS takes is a day; this bound is one the planner can read.
     AND a.finished_at > now() - interval '2 days'
    -- Each attempt's job by primary key (not a hash of every job in error).
    CROSS JOIN LATERAL (
        SELECT j.task FROM django_jobs_job j
        WHERE j.id = a.job_id AND j.state = 'error' AND j.attempt = a.number
          AND j.attempt >= j.max_attempts
        LIMIT 1
    ) j
    WHERE s.exhausted_threshold < 'Infinity'
    GROUP BY j.task, s.exhausted_threshold, s.exhausted_window
)
SELECT 'schedule_missed'::text AS kind, s.name::text AS subject,
       s.due + make_interval(secs => s.grace) AS since,
       concat_ws('; ',
           CASE WHEN s.success_at IS NULL THEN 'no successful run yet'
                ELSE 'last successful run: the tick of ' || {utc("s.success_at")}
                     || ' (job ' || s.success_job_id || ')' END,
           CASE WHEN s.missed > 0 THEN s.missed || ' tick(s) since, none succeeded' END,
           CASE WHEN extract(epoch FROM now() - s.next_run_at) > s.grace
                THEN 'its tick due at ' || {utc("s.next_run_at")} || ' was not fired: no '
                     || 'scheduler runs with its task registered' END,
           'grace ' || {seconds("s.grace")}) AS detail,
       CASE WHEN s.missed_past_grace >= 2 OR extract(epoch FROM now() - s.next_run_at) > s.grace
            THEN 'critical' ELSE 'warning' END AS severity,
       nullif(s.queue, '')::text AS queue, s.task::text AS task, s.success_job_id AS job_id,
       extract(epoch FROM now() - s.due)::float8 AS value, s.grace AS threshold
FROM schedules s
WHERE extract(epoch FROM now() - s.due) > s.grace
UNION ALL
SELECT 'job_overdue', o.id::text, o.started_at + make_interval(secs => o.limit_seconds),
       'job ' || o.id || ' has run ' || {seconds("o.running_seconds")} || ' on '
       || o.worker_id || ', expected at most ' || {seconds("o.limit_seconds")}
       || CASE WHEN o.expected IS NOT NULL THEN ' (its expected_duration)'
               ELSE ' (' || o.p95_factor || ' x the p95 of ' || {seconds("o.p95")}
                    || ' over the last ' || o.runs || ' successful runs of its task, and at '
                    || 'least ' || {seconds("o.min_seconds")} || ')' END,
       CASE WHEN o.running_seconds > 2 * o.limit_seconds THEN 'critical' ELSE 'warning' END,
       o.queue::text, o.task::text, o.id, o.running_seconds, o.limit_seconds
FROM overdue o
WHERE o.running_seconds > o.limit_seconds
UNION ALL
SELECT 'queue_age', r.queue::text, r.oldest_at + make_interval(secs => q.threshold),
       'the oldest ready job (' || r.oldest_id || ') has waited ' || {seconds("r.age")}
       || ', more than ' || {seconds("q.threshold")},
       CASE WHEN r.age > 2 * q.threshold THEN 'critical' ELSE 'warning' END,
       r.queue::text, NULL::text, r.oldest_id, r.age, q.threshold
FROM ready r
CROSS JOIN LATERAL (SELECT {threshold("queue_age", "r.queue", "600")} AS threshold) q
WHERE r.age > q.threshold
UNION ALL
SELECT 'queue_no_worker', r.queue::text, w.since + make_interval(secs => g.grace),
       'ready jobs (the oldest: ' || r.oldest_id || ', ready since ' || {utc("r.oldest_at")}
       || ') and no live worker serves the queue'
       || CASE WHEN w.last_seen IS NULL THEN ''
               ELSE '; the last one was seen at ' || {utc("w.last_seen")} END,
       'critical', r.queue::text, NULL::text, r.oldest_id,
       extract(epoch FROM now() - w.since)::float8, g.grace
FROM ready r
CROSS JOIN settings s
CROSS JOIN LATERAL (
    SELECT max(w.last_seen_at) AS last_seen,
           count(*) FILTER (
               WHERE w.last_seen_at >= now() - make_interval(secs => s.worker_timeout)) AS alive,
           greatest(r.oldest_at,
                    max(w.last_seen_at) + make_interval(secs => s.worker_timeout)) AS since
    FROM django_jobs_worker w
    WHERE w.queues = '[]'::jsonb OR w.queues @> jsonb_build_array(r.queue)
) w
CROSS JOIN LATERAL (SELECT {threshold("no_worker", "r.queue", "60")} AS grace) g
WHERE w.alive = 0 AND extract(epoch FROM now() - w.since) > g.grace
UNION ALL
SELECT 'attempts_exhausted', e.task::text, e.first_at,
       e.recent || ' job(s) used up their attempts in the last '
       || {seconds("e.exhausted_window")} || ' (' || e.before || ' in the '
       || {seconds("e.exhausted_window")} || ' before); threshold ' || e.exhausted_threshold,
       CASE WHEN e.recent >= 2 * e.exhausted_threshold AND e.recent > e.before
            THEN 'critical' ELSE 'warning' END,
       NULL::text, e.task::text, NULL::bigint, e.recent::float8, e.exhausted_threshold
FROM exhausted e
WHERE e.recent >= e.exhausted_threshold
"""


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0021_steps_and_cursors")]

    operations = [
        migrations.CreateModel(
            name="AlertThreshold",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        help_text="schedule_grace, queue_age, no_worker, expected_duration, "
                        "overdue_p95_factor, overdue_min_seconds, exhausted_threshold or "
                        "exhausted_window.",
                        max_length=40,
                    ),
                ),
                (
                    "subject",
                    models.CharField(
                        help_text="A schedule, queue or task name; * for every other one.",
                        max_length=255,
                    ),
                ),
                (
                    "value",
                    models.FloatField(
                        help_text="Seconds, a factor or a count; Infinity: never fires."
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "django_jobs_alert_threshold",
                "ordering": ["kind", "subject"],
                "constraints": [
                    models.UniqueConstraint(fields=("kind", "subject"), name="alert_threshold_once")
                ],
            },
        ),
        migrations.RunSQL(VIEW, "DROP VIEW IF EXISTS django_jobs_alerts"),
    ]
