-- The claim as 0010_unknown_tasks_and_worker_pods made it: it passes over p_skip_tasks.
-- History.
CREATE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[], p_skip_tasks text[])
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
