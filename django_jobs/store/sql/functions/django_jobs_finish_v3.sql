-- The finish as 0009_children_of_an_attempt made it: it locks FOR NO KEY UPDATE, counts the
-- children of the attempt it ends only, and says whether any is unfinished. History.
CREATE FUNCTION django_jobs_finish(
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
        error = p_error
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
