-- What a running attempt reports while it runs: its progress and its captured log.

-- name: record_live
-- A run's progress and cursors (on the job row) and its log (on its attempt row), written by its
-- worker at most once per JOBS_PROGRESS_INTERVAL (cursors: JOBS_CURSOR_INTERVAL), and once more
-- just before its finish or its release. Fenced on the lease's token and attempt number, not on
-- the state: the last values, queued just before the finish, may land after it; a later claim
-- has another token. A NULL done, cursors or log leaves that part alone; cursors is a JSON
-- object of the cursors saved since the last write, by name, each merged into the job's cursors
-- with the attempt that saved it and the time. With a worker_id (the HTTP API, whose clients are
-- not trusted), all are fenced on the whole lease and only while the attempt runs: a write that
-- comes after the finish, or from another worker, changes nothing. Neither update changes an
-- indexed column, so both stay HOT (the job row's progress and cursor columns are in no index,
-- partial predicates and expressions included).
-- Index: the job's primary key; attempt_job_number_idx.
WITH job AS (
    UPDATE django_jobs_job
    SET progress_done = coalesce(%(done)s::float8, progress_done),
        progress_total = CASE WHEN %(done)s::float8 IS NULL THEN progress_total
                              ELSE %(total)s::float8 END,
        progress_message = CASE WHEN %(done)s::float8 IS NULL THEN progress_message
                                ELSE %(message)s::text END,
        progress_updated_at = CASE WHEN %(done)s::float8 IS NULL THEN progress_updated_at
                                   ELSE now() END,
        progress_attempt = CASE WHEN %(done)s::float8 IS NULL THEN progress_attempt
                                ELSE %(attempt)s END,
        cursors = CASE WHEN %(cursors)s::jsonb IS NULL THEN cursors
                       ELSE coalesce(cursors, '{}'::jsonb) || (
                           SELECT jsonb_object_agg(c.key, jsonb_build_object(
                               'value', c.value, 'attempt', %(attempt)s, 'saved_at', now()))
                           FROM jsonb_each(%(cursors)s::jsonb) c) END
    WHERE (%(done)s::float8 IS NOT NULL OR %(cursors)s::jsonb IS NOT NULL)
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
