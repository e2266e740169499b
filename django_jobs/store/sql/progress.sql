-- What a running attempt reports while it runs: its progress and its captured log.

-- name: record_live
-- A run's progress (on the job row) and its log (on its attempt row), written by its worker at
-- most once per JOBS_PROGRESS_INTERVAL, and once more just before its finish. Fenced on the
-- lease's token and attempt number, not on the state: the last values, queued just before the
-- finish, may land after it; a later claim has another token. A NULL done or log leaves that
-- part alone. With a worker_id (the HTTP API, whose clients are not trusted), both are fenced on
-- the whole lease and only while the attempt runs: a write that comes after the finish, or from
-- another worker, changes nothing. Neither update changes an indexed column, so both stay HOT (the job row's
-- progress columns are in no index, partial predicates and expressions included).
-- Index: the job's primary key; attempt_job_number_idx.
WITH job AS (
    UPDATE django_jobs_job
    SET progress_done = %(done)s::float8, progress_total = %(total)s::float8,
        progress_message = %(message)s::text, progress_updated_at = now(),
        progress_attempt = %(attempt)s
    WHERE %(done)s::float8 IS NOT NULL
      AND id = %(job_id)s AND attempt = %(attempt)s AND lease = %(lease)s::uuid
      AND (%(worker_id)s::text IS NULL OR (state = 'running' AND worker_id = %(worker_id)s::text))
    RETURNING id
), attempt AS (
    UPDATE django_jobs_attempt
    SET log = %(log)s::text
    WHERE %(log)s::text IS NOT NULL
      AND job_id = %(job_id)s AND number = %(attempt)s AND lease = %(lease)s::uuid
      AND (%(worker_id)s::text IS NULL
           OR (outcome = 'running' AND worker_id = %(worker_id)s::text))
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM job) AS progress, EXISTS (SELECT 1 FROM attempt) AS log
