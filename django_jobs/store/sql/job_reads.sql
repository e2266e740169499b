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
