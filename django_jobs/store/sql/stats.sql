-- Operations data (store/operations_views.py): reads of the SQL views of migration 0003, the public contract
-- that Grafana also queries (see docs/operations.md).

-- name: bound_reads
-- The statement timeout of a reading transaction, for the ORM's statements in it too (the
-- dashboard's running jobs); local to the transaction.
SELECT set_config('statement_timeout', %(ms)s, true)

-- name: queue_controls
-- The queue controls, read from JOBS_DATABASE whatever the read database: a replica that lags
-- must not show a queue just paused as open. A queue without a row is open, with no limit.
SELECT name AS queue, paused, paused_by, paused_at, pause_reason, concurrency_limit
FROM django_jobs_queue

-- name: view_thresholds
-- The views judge workers dead and jobs overdue by these session settings; set for the
-- reading transaction only.
SELECT set_config('django_jobs.worker_timeout', %(worker_timeout)s, true),
       set_config('django_jobs.timeout_grace', %(timeout_grace)s, true)

-- name: queue_summary
SELECT * FROM django_jobs_queue_summary ORDER BY queue, state

-- name: throughput
SELECT * FROM django_jobs_throughput
WHERE minute > now() - make_interval(mins => %(minutes)s) ORDER BY minute, queue, task

-- name: task_durations
SELECT * FROM django_jobs_task_durations ORDER BY queue, task

-- name: workers
SELECT * FROM django_jobs_workers ORDER BY name, worker_id

-- name: stuck_jobs
SELECT * FROM django_jobs_stuck_jobs ORDER BY age_seconds DESC, job_id LIMIT %(limit)s

-- name: recent_failures
SELECT * FROM django_jobs_recent_failures ORDER BY finished_at DESC LIMIT %(limit)s

-- name: summary_clock
SELECT now() AS generated_at

-- name: summary_states
SELECT * FROM django_jobs_queue_summary

-- name: summary_ended
SELECT queue, sum(done)::bigint AS done, sum(failed)::bigint AS failed,
       sum(cancelled)::bigint AS cancelled
FROM django_jobs_throughput
WHERE minute > now() - make_interval(mins => %(minutes)s)
GROUP BY queue

-- name: summary_expired
-- Jobs that ended cancelled at their deadline (control.sql's expire_due) in the window. They
-- never started, so the attempts of django_jobs_throughput do not count them.
-- Index: job_finished_idx (finished_at, id), partial on the ended states.
SELECT queue, count(*) AS expired
FROM django_jobs_job
WHERE state IN ('done', 'error', 'cancelled') AND state = 'cancelled'
  AND finished_at > now() - make_interval(mins => %(minutes)s)
  AND error LIKE 'expired: %%'
GROUP BY queue

-- name: summary_stuck
SELECT queue, reason, count(*) AS jobs FROM django_jobs_stuck_jobs GROUP BY queue, reason

-- name: summary_workers
SELECT queues, concurrency, alive, running_jobs FROM django_jobs_workers

-- name: summary_schedules
-- Periodic jobs, from the django_jobs_schedules view (migration 0012).
SELECT name, task, expression, timezone, paused, removed_from_code, next_run_at, last_run_at,
       last_job_id, last_outcome, late_seconds
FROM django_jobs_schedules ORDER BY name

-- name: running
-- The running jobs with their progress, from the django_jobs_running view (migration 0014).
SELECT * FROM django_jobs_running ORDER BY started_at, job_id LIMIT %(limit)s

-- name: summary_progress
-- The running jobs that reported progress in their current attempt, the longest running first.
SELECT job_id, task, queue, worker_id, attempt, running_seconds, progress_done, progress_total,
       progress_percent, progress_message, progress_updated_at, progress_rate, eta_seconds
FROM django_jobs_running WHERE progress_done IS NOT NULL
ORDER BY started_at, job_id LIMIT 20

-- name: throughput_hours
-- Attempts ended per hour from %(since)s on (at most the view's last 24 hours), done and
-- failed, from django_jobs_throughput: the hours the rollups do not hold yet. The minute bound
-- reaches the attempts through attempt_finished_minute_idx.
SELECT date_trunc('hour', minute) AS hour, sum(done)::bigint AS done,
       sum(failed)::bigint AS failed
FROM django_jobs_throughput
WHERE minute >= %(since)s
GROUP BY 1
ORDER BY 1
