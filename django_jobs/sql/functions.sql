-- The PL/pgSQL functions on the worker's hot path, as the latest migration that makes them
-- (0010_unknown_tasks_and_worker_pods) created them; tests/test_transitions.py checks that the
-- migration and the database agree with this file. A change here needs a new migration that
-- replaces the function: copy the text into it, and restart the workers after migrating.
--
-- PostgreSQL keeps a function's plans for the life of its connection, so a worker does not pay
-- for planning these statements on every job, and nothing is prepared on the protocol, which
-- pgbouncer in transaction mode would break. The workers call them with call_claim and
-- call_finish (claim.sql, ending.sql).

-- name: django_jobs_claim
-- transition: claim
-- The claim of claim.sql, one branch per queue filter: claim_any_queue, claim_one_queue,
-- claim_some_queues, with the function's arguments for their parameters.
CREATE OR REPLACE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[], p_skip_tasks text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, lease uuid, attempt_id bigint
)
LANGUAGE plpgsql AS $body$#variable_conflict use_column
BEGIN
    IF p_queues IS NULL OR cardinality(p_queues) = 0 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now()
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    ELSIF cardinality(p_queues) = 1 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = p_queues[1]
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    ELSE
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = ANY(p_queues)
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    END IF;
END
$body$
;

-- name: django_jobs_finish
-- transition: end attempt
-- The end of an attempt by its worker: the statement of ending.sql's reap, without the
-- re-check of the reason and without SKIP LOCKED.
CREATE OR REPLACE FUNCTION django_jobs_finish(
    p_job_id bigint, p_attempt integer, p_worker_id text, p_lease uuid, p_outcome text,
    p_result text, p_error text, p_traceback text, p_retryable boolean, p_retry_delay float8
)
RETURNS TABLE (state varchar, parent_id bigint, has_dependents boolean, has_children boolean)
LANGUAGE plpgsql AS $body$#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH target AS (
    SELECT id, attempt,
           CASE
               WHEN p_outcome = 'done' THEN
                   CASE WHEN NOT EXISTS (
                       SELECT 1 FROM django_jobs_job c
                       WHERE c.parent_id = j.id AND c.state IN ('waiting', 'pending', 'running')
                         AND (c.parent_attempt IS NULL OR c.parent_attempt = j.attempt)
                   ) THEN 'done'
                   WHEN cancel_requested THEN 'cancelled'
                   ELSE 'waiting' END
               WHEN cancel_requested OR p_outcome = 'cancelled' THEN 'cancelled'
               WHEN p_retryable AND attempt < max_attempts THEN 'pending'
               ELSE 'error'
           END AS new_state
    FROM django_jobs_job j
    WHERE id = p_job_id AND state = 'running' AND attempt = p_attempt
      AND worker_id = p_worker_id AND lease IS NOT DISTINCT FROM p_lease::uuid
    FOR NO KEY UPDATE
), job AS (
    UPDATE django_jobs_job j
    SET state = t.new_state,
        finished_at = CASE WHEN t.new_state IN ('pending', 'waiting') THEN NULL ELSE now() END,
        run_after = CASE WHEN t.new_state = 'pending'
                         THEN now() + make_interval(secs => p_retry_delay)
                         ELSE j.run_after END,
        worker_id = CASE WHEN t.new_state = 'pending' THEN NULL ELSE j.worker_id END,
        result = p_result::jsonb,
        error = p_error,
        task_missing_since = NULL
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, j.state, j.parent_id, j.attempt
), closed AS (
    UPDATE django_jobs_attempt a
    SET finished_at = now(), outcome = p_outcome, error = p_error, traceback = p_traceback
    FROM target t
    WHERE a.job_id = t.id AND a.number = t.attempt AND a.worker_id = p_worker_id
      AND a.lease IS NOT DISTINCT FROM p_lease::uuid AND a.outcome = 'running'
)
SELECT state, parent_id,
       EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = job.id),
       EXISTS (SELECT 1 FROM django_jobs_job c
               WHERE c.parent_id = job.id AND c.state IN ('waiting', 'pending', 'running')
                 AND (c.parent_attempt IS NULL OR c.parent_attempt = job.attempt))
FROM job
;
END
$body$
;
