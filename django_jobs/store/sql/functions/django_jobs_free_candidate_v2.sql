-- The claim's candidate without a key (see django_jobs_claim): the first ready job without a
-- key of each open queue (a skip scan of job_claim_free_queue_idx, one probe per queue), the
-- first of them in claim order. Read without a lock: claim_one_queue then claims on its queue.
-- The queue is matched as a range for the reason given in django_jobs_keyed_candidate.
-- Version 2: a job past its deadline (expires_at) is never a candidate (0028_time_controls).
-- Made by 0028_time_controls.
CREATE OR REPLACE FUNCTION django_jobs_free_candidate(
    p_queues text[], p_closed text[], p_skip_tasks text[]
)
RETURNS TABLE (id bigint, priority smallint, run_after timestamptz, queue varchar)
LANGUAGE plpgsql STABLE AS $body$#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH RECURSIVE queues(q) AS (
    (SELECT queue FROM django_jobs_job
     WHERE state = 'pending' AND concurrency_key IS NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT n.queue FROM queues s CROSS JOIN LATERAL (
        SELECT queue FROM django_jobs_job
        WHERE state = 'pending' AND concurrency_key IS NULL AND queue > s.q
        ORDER BY queue LIMIT 1
    ) n
)
SELECT j.id, j.priority, j.run_after, j.queue
FROM queues s CROSS JOIN LATERAL (
    SELECT j.id, j.priority, j.run_after, j.queue FROM django_jobs_job j
    WHERE j.state = 'pending' AND j.concurrency_key IS NULL AND j.queue >= s.q
      AND j.queue <= s.q AND j.run_after <= now()
      AND (j.expires_at IS NULL OR j.expires_at > now())
      AND (p_skip_tasks IS NULL OR j.task <> ALL(p_skip_tasks))
    ORDER BY j.queue, j.priority DESC, j.run_after, j.id
    LIMIT 1
) j
WHERE (p_queues IS NULL OR s.q = ANY(p_queues)) AND s.q <> ALL(p_closed)
ORDER BY j.priority DESC, j.run_after, j.id
LIMIT 1
;
END
$body$
