-- How a claim ends: finished by its worker, reaped, released or handed back. Every write is
-- fenced on the claim's lease (attempt, worker and token): a statement that matches no row
-- means the lease was lost.

-- name: call_finish
-- The worker's finish: django_jobs_finish() (functions/django_jobs_finish_v<N>.sql, the newest),
-- which decides the job's next state and closes the attempt.
SELECT * FROM django_jobs_finish(%(job_id)s::bigint, %(attempt)s::integer, %(worker_id)s::text,
                                 %(lease)s::uuid, %(outcome)s::text, %(result)s::text,
                                 %(error)s::text, %(traceback)s::text, %(retryable)s::boolean,
                                 %(retry_delay)s::float8)

-- name: call_finish_then_claim
-- The HTTP API's finish that also claims the worker's next job (v1/jobs/<id>/finish with
-- claim_next): call_finish, then call_claim for the same worker, but only if the finish matched
-- the lease. One statement, so one transaction in one round trip, as a database worker's
-- finish_and_claim. A lost lease claims nothing: the API answers it with the one generic 409,
-- which carries no job. The claim is the LATERAL side of a LEFT JOIN with no join condition, so
-- the only plan is a nested loop whose outer side, the finish, runs to its end first; with no
-- finish row, the claim is never called. Each function takes a new snapshot per statement, so
-- the claim sees what the finish wrote (a queue or key slot it freed). With it, the checkpoint
-- of the job it claims, read by django_jobs_checkpoint as call_claim_with_checkpoint reads it
-- (claim.sql), so that the worker resumes the next job from the answer; it is the innermost side
-- of the joins, read once the claim has run, and only for a claimed job. A job claimed again by
-- its own finish (a retry due at once) gets the steps and cursors of the attempt that has just
-- ended.
-- One row: the finish's four columns, the claim's, then the claimed job's steps and cursors as
-- JSON text (all NULL when no job was claimed).
-- Index: those of django_jobs_finish, django_jobs_claim and django_jobs_checkpoint.
SELECT f.state, f.parent_id, f.has_dependents, f.has_children, c.*, k.steps, k.cursors
FROM django_jobs_finish(%(job_id)s::bigint, %(attempt)s::integer, %(worker_id)s::text,
                        %(lease)s::uuid, %(outcome)s::text, %(result)s::text,
                        %(error)s::text, %(traceback)s::text, %(retryable)s::boolean,
                        %(retry_delay)s::float8) AS f
LEFT JOIN LATERAL django_jobs_claim(%(worker_id)s::text, %(queues)s::text[],
                                    %(skip_tasks)s::text[]) AS c ON true
LEFT JOIN LATERAL django_jobs_checkpoint(c.id) AS k ON true

-- name: reap
-- transition: end attempt
-- The reaper's end of an attempt: the worker's finish (django_jobs_finish, which decides the
-- job's next state in one place), run on the job once this statement has locked it and
-- re-checked why it is reaped. Two things differ from the worker's finish: SKIP LOCKED, so a
-- reaper never waits on a row a worker is finishing right now; and the reason is re-checked
-- (the AND (...) on silence and timeout), so a job that finished, was re-claimed, or whose
-- worker has just sent a heartbeat is left alone. silence NULL skips the heartbeat check, for a
-- worker known to be gone. The lock is FOR NO KEY UPDATE, as the claim's and the finish's, so
-- that a transaction enqueueing a dependent or a child of the job never holds it back; the
-- finish, fenced on the same lease, then finds the job locked by this statement and so
-- unchanged. The CTE is materialized so that the lock and the re-check come first, and the
-- finish runs only for the row they let through (LATERAL on its id).
-- Index: the job's primary key; the worker table's primary key for the heartbeat re-check;
-- those of django_jobs_finish.
WITH target AS MATERIALIZED (
    SELECT j.id FROM django_jobs_job j
    WHERE j.id = %(job_id)s AND j.state = 'running' AND j.attempt = %(attempt)s
      AND j.worker_id = %(worker_id)s AND j.lease IS NOT DISTINCT FROM %(lease)s::uuid
      AND (
        %(silence)s::float8 IS NULL
        OR NOT EXISTS (
            SELECT 1 FROM django_jobs_worker w
            WHERE w.id = j.worker_id
              AND w.last_seen_at >= now() - make_interval(secs => %(silence)s::float8)
        )
        OR (j.timeout IS NOT NULL
            AND j.started_at < now() - make_interval(secs => j.timeout + %(timeout_grace)s))
      )
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT f.state, f.parent_id, f.has_dependents, f.has_children
FROM target t CROSS JOIN LATERAL django_jobs_finish(
    t.id, %(attempt)s::integer, %(worker_id)s::text, %(lease)s::uuid, %(outcome)s::text,
    %(result)s::text, %(error)s::text, %(traceback)s::text, %(retryable)s::boolean,
    %(retry_delay)s::float8
) f

-- name: release
-- transition: release
-- Hand an unfinished job back, at shutdown or when its worker finds it never got the claim's
-- reply (an orphan, see heartbeat in workers.sql). The attempt is given back too, since the job
-- did not fail; the Attempt row stays, marked released.
-- Index: the primary key; attempt_job_number_idx.
WITH job AS (
    UPDATE django_jobs_job
    SET state = 'pending', attempt = attempt - 1, worker_id = NULL, run_after = now(),
        task_missing_since = NULL
    WHERE id = %(job_id)s AND state = 'running' AND attempt = %(attempt)s
      AND worker_id = %(worker_id)s AND lease IS NOT DISTINCT FROM %(lease)s::uuid
    RETURNING id, pg_notify('django_jobs', queue) IS NULL
), closed AS (
    UPDATE django_jobs_attempt SET finished_at = now(), outcome = 'released', error = %(reason)s
    WHERE job_id = %(job_id)s AND number = %(attempt)s AND worker_id = %(worker_id)s
      AND lease IS NOT DISTINCT FROM %(lease)s::uuid AND outcome = 'running'
      AND EXISTS (SELECT 1 FROM job)
)
SELECT id FROM job

-- name: hand_back
-- transition: release
-- Hand back a job whose task this worker has not registered (a rolling deploy: pods that run
-- the new release enqueue it before every worker runs that release). Like a release, it does
-- not count the attempt; and since nothing ran, the attempt row goes too, so that a job offered
-- to many old workers piles up no rows. The job stays where it was in the queue: the worker
-- passes over the task's jobs for a while (the claim's skip_tasks), and a worker that has the
-- task takes it at once.
-- task_missing_since says since when workers have been found without the task: the job's own
-- mark, else the earliest mark of the task's waiting jobs, else the earliest the worker has
-- seen itself (seen_since), else now(). A job that runs loses its mark (finish, reap and
-- release clear it). The job is not handed back but reported 'expired' when that is longer ago
-- than give_up_after and no live worker has registered the task: the worker then ends it in
-- error, as a finish.
-- Index: the primary key; job_task_missing_idx for the task's marks; attempt_job_number_idx;
-- the worker table is small.
WITH target AS (
    SELECT j.id,
           COALESCE(j.task_missing_since,
                    (SELECT min(m.task_missing_since) FROM django_jobs_job m
                     WHERE m.task = j.task AND m.state = 'pending'
                       AND m.task_missing_since IS NOT NULL),
                    %(seen_since)s::timestamptz,
                    now()) AS missing_since
    FROM django_jobs_job j
    WHERE j.id = %(job_id)s AND j.state = 'running' AND j.attempt = %(attempt)s
      AND j.worker_id = %(worker_id)s AND j.lease IS NOT DISTINCT FROM %(lease)s::uuid
), verdict AS (
    SELECT t.id, t.missing_since,
           t.missing_since < now() - make_interval(secs => %(give_up_after)s::float8)
           AND NOT EXISTS (
               SELECT 1 FROM django_jobs_worker w
               WHERE w.tasks ? %(task)s
                 AND w.last_seen_at >= now() - make_interval(secs => %(worker_timeout)s::float8)
           ) AS expired
    FROM target t
), job AS (
    UPDATE django_jobs_job j
    SET state = 'pending', attempt = j.attempt - 1, worker_id = NULL,
        task_missing_since = v.missing_since, error = %(reason)s
    FROM verdict v
    WHERE j.id = v.id AND NOT v.expired
      AND j.state = 'running' AND j.lease IS NOT DISTINCT FROM %(lease)s::uuid
    RETURNING j.id, pg_notify('django_jobs', j.queue) IS NULL
), gone AS (
    DELETE FROM django_jobs_attempt
    WHERE job_id = %(job_id)s AND number = %(attempt)s AND worker_id = %(worker_id)s
      AND lease IS NOT DISTINCT FROM %(lease)s::uuid AND outcome = 'running'
      AND EXISTS (SELECT 1 FROM job)
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM job) THEN 'handed back'
            WHEN v.expired THEN 'expired' END AS verdict,
       v.missing_since
FROM verdict v

-- name: attempt_outcome
-- What became of one claim's attempt: its outcome ('running' while it runs), or no row if no
-- attempt row carries that lease. A worker asks when a write it retried after a broken
-- connection matched nothing: if the first try had committed, the outcome is the one it wrote.
-- The whole lease is matched (attempt number and worker too), as the HTTP API asks of a lease
-- its client sends. Index: attempt_job_number_idx.
SELECT outcome FROM django_jobs_attempt
WHERE job_id = %(job_id)s AND number = %(attempt)s AND lease = %(lease)s::uuid
  AND worker_id = %(worker_id)s
