-- The worker's claim as 0005_hot_path_functions made it: one statement per branch (any queue,
-- one queue, some queues). History: the newest version is the one that runs.
CREATE OR REPLACE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, attempt_id bigint
)
LANGUAGE plpgsql AS $body$
#variable_conflict use_column
BEGIN
    IF p_queues IS NULL OR cardinality(p_queues) = 0 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now()
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '' FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    ELSIF cardinality(p_queues) = 1 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = p_queues[1]
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '' FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    ELSE
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = ANY(p_queues)
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '' FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    END IF;
END
$body$
