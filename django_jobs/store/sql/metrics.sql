-- The Prometheus endpoint's reads (django_jobs/metrics/, store/metrics.py): every number comes
-- from PostgreSQL, so every web process answers the same. Each statement reads indexes or small
-- tables only, whatever the number of finished jobs.

-- name: metrics_queues
-- Per queue (those with unfinished jobs, controls, or a worker that names them): unfinished jobs
-- by state, ready and scheduled jobs, the oldest ready job's age, the queue's controls, and its
-- live workers (those that serve every queue included). The unfinished jobs come from the
-- django_jobs_queue_summary view (job_claim_queue_idx, job_running_worker_idx,
-- job_waiting_idx), read once.
WITH summary AS MATERIALIZED (
    SELECT queue, state, jobs, ready, scheduled, oldest_age_seconds
    FROM django_jobs_queue_summary
), live AS MATERIALIZED (
    SELECT queues FROM django_jobs_worker
    WHERE last_seen_at >= now() - make_interval(secs => django_jobs_setting('worker_timeout', 60))
), names AS (
    SELECT queue FROM summary
    UNION SELECT name FROM django_jobs_queue
    UNION SELECT jsonb_array_elements_text(queues) FROM django_jobs_worker
)
SELECT n.queue,
       coalesce(sum(s.jobs) FILTER (WHERE s.state = 'pending'), 0)::bigint AS pending,
       coalesce(sum(s.jobs) FILTER (WHERE s.state = 'running'), 0)::bigint AS running,
       coalesce(sum(s.jobs) FILTER (WHERE s.state = 'waiting'), 0)::bigint AS waiting,
       coalesce(sum(s.ready), 0)::bigint AS ready,
       coalesce(sum(s.scheduled), 0)::bigint AS scheduled,
       coalesce(max(s.oldest_age_seconds) FILTER (WHERE s.state = 'pending'), 0)::float8
           AS oldest_ready_age_seconds,
       (SELECT count(*) FROM live w WHERE w.queues = '[]'::jsonb OR w.queues ? n.queue)
           AS live_workers,
       coalesce(bool_or(c.paused), false) AS paused,
       max(c.concurrency_limit) AS concurrency_limit
FROM names n
LEFT JOIN summary s ON s.queue = n.queue
LEFT JOIN django_jobs_queue c ON c.name = n.queue
GROUP BY n.queue
ORDER BY n.queue

-- name: metrics_workers
-- Registered workers, live or silent (past django_jobs.worker_timeout), with their executor
-- slots and the jobs running under them (job_running_worker_idx).
SELECT alive, count(*) AS workers, coalesce(sum(concurrency), 0)::bigint AS slots,
       coalesce(sum(running_jobs), 0)::bigint AS running_jobs
FROM django_jobs_workers GROUP BY alive

-- name: metrics_finished
-- Finished jobs and ended attempts per queue, task and outcome, since the beginning: the
-- rollups' all-time totals (django_jobs_rollup_total, small), plus what ended after their
-- watermark (job_finished_idx and attempt_finished_minute_idx, from the watermark on: an hour
-- or so). One statement, so one snapshot: a pass that moves the watermark moves its rows from
-- the second part to the first, and the sums never go back. %(since)s is the watermark as read
-- just before (metrics_rollups), for the planner's estimates: the watermark only moves on, so
-- the one this statement reads is never earlier, and it is the one that counts. Rows:
-- - kind 'total': the totals, with their duration buckets;
-- - kind 'jobs': finished jobs after the watermark (with their waits);
-- - kind 'attempts': ended attempts after the watermark, per duration bucket, durations rounded
--   and bucketed exactly as the rollups do (store/sql/rollups.sql, roll_up).
WITH mark AS (
    SELECT coalesce((SELECT rolled_until FROM django_jobs_rollup_state WHERE id = 1),
                    '-infinity'::timestamptz) AS rolled_until
)
SELECT 'total' AS kind, queue, task, outcome, jobs, attempts,
       duration_seconds_total AS seconds, NULL::int AS bucket, duration_buckets AS buckets,
       waited_jobs, wait_seconds_total AS wait_seconds
FROM django_jobs_rollup_total
UNION ALL
SELECT 'jobs', j.queue, j.task, j.state, count(*), 0, 0, NULL, NULL,
       count(j.started_at),
       coalesce(sum(round(greatest(extract(epoch FROM j.started_at - j.run_after)::float8, 0)
                          * 1048576) / 1048576), 0)
FROM django_jobs_job j
WHERE j.state IN ('done', 'error', 'cancelled')
  AND j.finished_at >= %(since)s::timestamptz
  AND j.finished_at >= (SELECT rolled_until FROM mark)
GROUP BY j.queue, j.task, j.state
UNION ALL
SELECT 'attempts', j.queue, j.task, a.outcome, 0, count(*), sum(a.summed), a.bucket, NULL, 0, 0
FROM (
    SELECT job_id, outcome, round(seconds * 1048576) / 1048576 AS summed,
           cardinality(%(bounds)s::float8[])
               - width_bucket(-seconds, %(negated_bounds)s::float8[]) AS bucket
    FROM (
        SELECT a.job_id, a.outcome,
               greatest(extract(epoch FROM a.finished_at - a.started_at)::float8, 0) AS seconds
        FROM django_jobs_attempt a
        WHERE timezone('UTC', date_trunc('minute', timezone('UTC', a.finished_at)))
              >= %(since)s::timestamptz
          AND timezone('UTC', date_trunc('minute', timezone('UTC', a.finished_at)))
              >= (SELECT rolled_until FROM mark)
    ) ended
) a
JOIN django_jobs_job j ON j.id = a.job_id
GROUP BY j.queue, j.task, a.outcome, a.bucket

-- name: metrics_rollups
-- The rollups' watermark (django_jobs_rollup_state, one row), and the seconds since it.
SELECT s.rolled_until, extract(epoch FROM now() - s.rolled_until)::float8 AS lag_seconds
FROM (VALUES (1)) AS one (id)
LEFT JOIN django_jobs_rollup_state s ON s.id = one.id

-- name: metrics_schedules
-- Per active schedule: its next tick, its lateness (the django_jobs_schedules view), and when
-- its last successful run finished: the newest tick whose job is done (the tick index
-- schedule_tick_once, newest first, then each tick's job by primary key; ticks and jobs
-- deleted by prunejobs are not counted).
SELECT v.name, v.task, extract(epoch FROM v.next_run_at)::float8 AS next_run_epoch,
       v.late_seconds, extract(epoch FROM l.finished_at)::float8 AS last_success_epoch
FROM django_jobs_schedules v
JOIN django_jobs_schedule s ON s.name = v.name
LEFT JOIN LATERAL (
    SELECT j.finished_at
    FROM django_jobs_schedule_tick t
    JOIN django_jobs_job j ON j.id = t.job_id
    WHERE t.schedule_id = s.id AND j.state = 'done'
    ORDER BY t.fire_at DESC LIMIT 1
) l ON true
WHERE NOT v.paused AND NOT v.removed_from_code
ORDER BY v.name

-- name: metrics_alerts
-- The firing alerts: the rows of the django_jobs_alerts view (migration 0022).
SELECT kind, subject, severity FROM django_jobs_alerts ORDER BY kind, subject
