-- What a running job, and the API serving its worker, read of one job.

-- name: stop_wanted
-- Whether a run should stop: its job's cancellation was requested, or (a run with a lease) the
-- run lost its lease, the job being reaped, re-claimed or ended under another run. No row: the
-- job was deleted. Index: the job table's primary key.
SELECT cancel_requested OR state = 'cancelled'
       OR (%(lease)s::uuid IS NOT NULL
           AND (state <> 'running' OR lease IS DISTINCT FROM %(lease)s::uuid)) AS stop
FROM django_jobs_job
WHERE id = %(id)s

-- name: stop_reason
-- Why a run should stop, for context.raise_if_cancelled(): 'lease_lost' (a run with a lease
-- whose job is no longer running that claim), 'cancel_requested', or NULL to go on. No row: the
-- job was deleted. Index: the job table's primary key.
SELECT CASE WHEN %(lease)s::uuid IS NOT NULL
                 AND (state <> 'running' OR lease IS DISTINCT FROM %(lease)s::uuid)
            THEN 'lease_lost'
            WHEN cancel_requested OR state = 'cancelled' THEN 'cancel_requested'
       END AS reason
FROM django_jobs_job
WHERE id = %(id)s

-- name: lock_spawning_parent
-- A parent about to spawn a child, as its run sees it. FOR KEY SHARE, as the child's foreign key
-- takes it: it waits for nobody that only updates the job (a finish, a cancel), and keeps the
-- row from being deleted until the child is committed. Index: the job table's primary key.
SELECT state, lease::text AS lease, cancel_requested, attempt, worker_id
FROM django_jobs_job
WHERE id = %(id)s
FOR KEY SHARE

-- name: job_queues
-- The queue of each of the jobs ids, for the HTTP API's check that a depends_on names only jobs
-- of queues its token holds. Index: the job table's primary key.
SELECT id, queue FROM django_jobs_job WHERE id = ANY(%(ids)s::bigint[])

-- name: task_of_job
-- The task of a job, whose backoff the API applies to a retryable failure that names no delay.
-- Index: the job table's primary key.
SELECT task FROM django_jobs_job WHERE id = %(id)s

-- name: next_ready_within
-- Seconds until the next pending job of queues (NULL: every queue) that is not paused becomes
-- ready, if one does within `within` seconds (a retry waiting out its backoff, a delayed job);
-- no row or a NULL otherwise. Asked by a --burst worker with --burst-wait when it finds nothing
-- ready, about once per poll interval. Index: job_claim_free_idx / job_claim_free_queue_idx.
SELECT EXTRACT(EPOCH FROM min(j.run_after) - now())::float8 AS seconds
FROM django_jobs_job j
WHERE j.state = 'pending'
  AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
  AND j.run_after <= now() + make_interval(secs => %(within)s)
  AND NOT (j.task = ANY(%(skip_tasks)s::text[]))
  AND NOT EXISTS (SELECT 1 FROM django_jobs_queue q WHERE q.name = j.queue AND q.paused)

-- name: job_view
-- One job as the HTTP API's job view shows it (v1/jobs/<id>): its state, attempts, times, last
-- error, cancellation, progress and cursors (each cursor's value, the attempt that saved it and
-- when), for a client that holds its queue; its steps are read by job_steps. No row: no such job.
-- Index: the job table's primary key.
SELECT id, task, queue, state, attempt, max_attempts, created_at, started_at, finished_at,
       error, cancel_requested, progress_done, progress_total, progress_message,
       cursors::text AS cursors
FROM django_jobs_job
WHERE id = %(id)s

-- name: rate_next_start
-- When a pending job held by a rate limit may start: the latest free_at of its windows (its
-- key's and its queue's) that is still ahead; NULL when neither is full. Index: the primary
-- keys of django_jobs_rate and django_jobs_queue.
SELECT max(w.free_at) FROM django_jobs_rate w
WHERE w.free_at > now()
  AND (w.key = 'key:' || %(rate_key)s::text
       OR (w.key = 'queue:' || %(queue)s::text
           AND EXISTS (SELECT FROM django_jobs_queue q
                       WHERE q.name = %(queue)s AND q.rate_limit IS NOT NULL)))
