-- transition: end attempt
-- Ending an attempt, by its worker (call_finish) or by the reaper (reap, in ending.sql, once it
-- has locked the job and re-checked why). It is fenced on the lease (and locks FOR NO KEY
-- UPDATE, as the claim does, so that a transaction enqueueing a dependent or a child of the job
-- never holds it back), decides the job's next state in one place, and closes the attempt row:
-- - success: done, or waiting if the job spawned children that are not finished yet (the
--   parent is finalized when its last child ends, see workflows.sql), or cancelled if its
--   cancellation was requested meanwhile (its unfinished children are then cancelled too);
-- - cancelled if cancellation was asked for;
-- - pending again, after the retry delay counted from the database's now(), while attempts
--   remain and the failure is retryable;
-- - error otherwise.
-- It also says whether the job has a parent, dependents, or unfinished children of this
-- attempt, which then need settling. A parent's outcome is decided by the children of its
-- final attempt only (parent_attempt); those of an attempt that failed are cancelled by the
-- settling.
-- Index: the job's primary key; job_parent_idx for active children; attempt_job_number_idx.
-- Made by 0010_unknown_tasks_and_worker_pods.
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
