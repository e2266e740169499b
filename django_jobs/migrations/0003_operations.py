"""Operations: storage parameters for high-churn tables, the indexes behind the views, and the
stable SQL views that Grafana, ``jobstats`` and people query (documented in docs/operations.md).

The views are a public contract. A later migration may add columns at the end of a view
(``CREATE OR REPLACE VIEW``); renaming, retyping or removing a column is a breaking change.

Indexes are built ``CONCURRENTLY`` so that upgrading a busy queue does not block its writers;
this is why the migration is not atomic. If it is interrupted, drop the indexes it had created
(an interrupted concurrent build leaves an INVALID index behind) and run ``migrate`` again.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from django_jobs.store.sql.functions import replace_function

# Storage parameters. Job rows are updated at every transition (claim, finish, retry); the
# worker table is rewritten by every heartbeat; attempts are inserted, then updated once.
# Lower vacuum and analyze thresholds keep dead tuples and stale statistics small on tables
# whose hot rows are a thin recent slice of millions of finished ones. fillfactor leaves room
# on each page for new row versions: heartbeats (no indexed column changes) become HOT
# updates, and job updates stay on their page instead of scattering over the table.
STORAGE = {
    "django_jobs_job": {
        "fillfactor": "85",
        "autovacuum_vacuum_scale_factor": "0.01",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_vacuum_insert_scale_factor": "0.02",
        "autovacuum_analyze_scale_factor": "0.02",
        "autovacuum_analyze_threshold": "1000",
    },
    "django_jobs_attempt": {
        "fillfactor": "90",
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_vacuum_insert_scale_factor": "0.05",
        "autovacuum_analyze_scale_factor": "0.05",
    },
    "django_jobs_worker": {
        "fillfactor": "50",
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "200",
        "autovacuum_analyze_scale_factor": "0",
        "autovacuum_analyze_threshold": "200",
    },
}


def _set_storage(table: str, params: dict[str, str]) -> migrations.RunSQL:
    assignments = ", ".join(f"{name} = {value}" for name, value in params.items())
    return migrations.RunSQL(
        f"ALTER TABLE {table} SET ({assignments})",
        f"ALTER TABLE {table} RESET ({', '.join(params)})",
    )


# Thresholds of the views, read from custom session settings with django-jobs' defaults:
# django_jobs.worker_timeout (JOBS_WORKER_TIMEOUT, 60 s), django_jobs.timeout_grace
# (JOBS_TIMEOUT_GRACE, 60 s), django_jobs.late_pending_after (900 s), by django_jobs_setting
# (django_jobs/store/sql/functions/django_jobs_setting_v1.sql). Set them per database or role when
# your settings differ: ALTER DATABASE app SET django_jobs.worker_timeout = 120.

# The UTC minute of a timestamp, as an immutable expression (date_trunc on timestamptz depends
# on the session's TimeZone, so it cannot be indexed). Views group by exactly this expression,
# so a filter on their minute column is pushed down to this index. The index is not partial:
# the planner uses an expression index's statistics only when it covers the whole table, and
# without them it would misjudge every time range.
MINUTE = "timezone('UTC', date_trunc('minute', timezone('UTC', {column})))"
MINUTE_INDEX = f"""
CREATE INDEX CONCURRENTLY IF NOT EXISTS attempt_finished_minute_idx
ON django_jobs_attempt (({MINUTE.format(column="finished_at")}))
"""

FAILED = "('crashed', 'error', 'lost', 'timeout')"

VIEWS = {
    # Unfinished jobs per queue and state. Cost follows the number of unfinished jobs:
    # pending rows by job_claim_queue_idx, running rows by job_running_worker_idx, waiting rows
    # by job_waiting_idx; finished jobs are never read.
    "django_jobs_queue_summary": """
SELECT queue, 'pending'::text AS state, count(*) AS jobs,
       count(*) FILTER (WHERE run_after <= now()) AS ready,
       count(*) FILTER (WHERE run_after > now()) AS scheduled,
       min(run_after) FILTER (WHERE run_after <= now()) AS oldest_at,
       extract(epoch FROM now() - min(run_after) FILTER (WHERE run_after <= now()))::float8
           AS oldest_age_seconds
FROM django_jobs_job WHERE state = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'running'::text, count(*), 0::bigint, 0::bigint, min(started_at),
       extract(epoch FROM now() - min(started_at))::float8
FROM django_jobs_job WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'waiting'::text, count(*), 0::bigint, 0::bigint, min(created_at),
       extract(epoch FROM now() - min(created_at))::float8
FROM django_jobs_job WHERE state = 'waiting' GROUP BY queue
""",
    # Ended attempts per UTC minute, queue and task over the last 24 hours.
    # Index: attempt_finished_minute_idx; a filter on minute narrows the index range.
    "django_jobs_throughput": f"""
SELECT {MINUTE.format(column="a.finished_at")} AS minute, j.queue, j.task,
       count(*) AS attempts,
       count(*) FILTER (WHERE a.outcome = 'done') AS done,
       count(*) FILTER (WHERE a.outcome IN {FAILED}) AS failed,
       count(*) FILTER (WHERE a.outcome = 'cancelled') AS cancelled
FROM django_jobs_attempt a
JOIN django_jobs_job j ON j.id = a.job_id
WHERE a.finished_at IS NOT NULL
  AND {MINUTE.format(column="a.finished_at")}
      >= {MINUTE.format(column="now() - interval '24 hours'")}
GROUP BY 1, 2, 3
""",
    # Run time of the successful attempts of the last hour, per queue and task.
    # Index: attempt_finished_minute_idx.
    "django_jobs_task_durations": f"""
SELECT j.queue, j.task, count(*) AS attempts,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at))::float8
           AS p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at))::float8
           AS p95_seconds,
       max(extract(epoch FROM a.finished_at - a.started_at))::float8 AS max_seconds
FROM django_jobs_attempt a
JOIN django_jobs_job j ON j.id = a.job_id
WHERE a.outcome = 'done' AND a.finished_at IS NOT NULL
  AND {MINUTE.format(column="a.finished_at")}
      >= {MINUTE.format(column="now() - interval '1 hour'")}
GROUP BY j.queue, j.task
""",
    # One row per registered worker. The worker table is small; running jobs are counted with
    # job_running_worker_idx.
    "django_jobs_workers": """
SELECT w.id AS worker_id, w.name, w.host, w.pid, w.queues, w.concurrency, w.started_at,
       w.last_seen_at,
       extract(epoch FROM now() - w.last_seen_at)::float8 AS seen_seconds_ago,
       w.last_seen_at >= now() - make_interval(secs => django_jobs_setting('worker_timeout', 60))
           AS alive,
       (SELECT count(*) FROM django_jobs_job j
        WHERE j.state = 'running' AND j.worker_id = w.id) AS running_jobs
FROM django_jobs_worker w
""",
    # Jobs that need a look: running past their timeout (plus the reaper's grace), running on
    # a worker without a recent heartbeat, or pending long after they became ready.
    # Index: job_running_worker_idx for running rows; job_claim_idx for pending rows.
    "django_jobs_stuck_jobs": """
SELECT j.id AS job_id, j.queue, j.task, j.state,
       CASE WHEN j.timeout IS NOT NULL
                 AND j.started_at < now() - make_interval(
                     secs => j.timeout + django_jobs_setting('timeout_grace', 60))
            THEN 'past_timeout' ELSE 'worker_dead' END AS reason,
       j.worker_id, j.attempt, j.max_attempts, j.started_at AS since,
       extract(epoch FROM now() - j.started_at)::float8 AS age_seconds,
       w.last_seen_at AS worker_last_seen_at
FROM django_jobs_job j
LEFT JOIN django_jobs_worker w ON w.id = j.worker_id
WHERE j.state = 'running'
  AND ((j.timeout IS NOT NULL
        AND j.started_at < now() - make_interval(
            secs => j.timeout + django_jobs_setting('timeout_grace', 60)))
       OR w.id IS NULL
       OR w.last_seen_at < now() - make_interval(
           secs => django_jobs_setting('worker_timeout', 60)))
UNION ALL
SELECT j.id, j.queue, j.task, j.state, 'late_pending', j.worker_id, j.attempt, j.max_attempts,
       j.run_after, extract(epoch FROM now() - j.run_after)::float8, NULL::timestamptz
FROM django_jobs_job j
WHERE j.state = 'pending'
  AND j.run_after < now() - make_interval(secs => django_jobs_setting('late_pending_after', 900))
""",
    # Failed attempts of the last 24 hours, with their error. Index: attempt_failed_idx (partial
    # on the failed outcomes), newest first, then the job's primary key.
    "django_jobs_recent_failures": f"""
SELECT a.id AS attempt_id, a.job_id, j.queue, j.task, a.number AS attempt, j.max_attempts,
       a.outcome, a.worker_id, a.started_at, a.finished_at,
       extract(epoch FROM a.finished_at - a.started_at)::float8 AS duration_seconds,
       a.error, j.state AS job_state
FROM django_jobs_attempt a
JOIN django_jobs_job j ON j.id = a.job_id
WHERE a.outcome IN {FAILED} AND a.finished_at >= now() - interval '24 hours'
""",
}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0002_worker_boot_id"),
    ]

    operations = [
        *(_set_storage(table, params) for table, params in STORAGE.items()),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("created_at"),
                condition=models.Q(("state", "waiting")),
                name="job_waiting_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("finished_at"),
                models.F("id"),
                condition=models.Q(("state__in", ["cancelled", "done", "error"])),
                name="job_finished_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="attempt",
            index=models.Index(
                models.F("finished_at"),
                condition=models.Q(("outcome__in", ["crashed", "error", "lost", "timeout"])),
                name="attempt_failed_idx",
            ),
        ),
        migrations.RunSQL(
            MINUTE_INDEX, "DROP INDEX CONCURRENTLY IF EXISTS attempt_finished_minute_idx"
        ),
        replace_function(
            "django_jobs_setting",
            1,
            reverse_drop="DROP FUNCTION IF EXISTS django_jobs_setting(text, float8)",
        ),
        *(
            migrations.RunSQL(
                f"CREATE OR REPLACE VIEW {name} AS {sql}", f"DROP VIEW IF EXISTS {name}"
            )
            for name, sql in VIEWS.items()
        ),
    ]
