-- The claim's keyed candidate (see django_jobs_claim): the first ready job, in claim order, of
-- the (key, queue) pairs of the open queues whose key has a free slot. A skip scan of
-- job_claim_key_idx finds the pairs (one probe each), then one probe finds each pair's first
-- ready job and one count of job_running_key_idx its key's running jobs. The count is read
-- without a lock: the claim counts again under the key's lock before it takes the slot. The
-- pair is matched as a range (>= and <=), not with =, and the order names the index's leading
-- columns: a plan made before the pair is known must then read the pair's own part of the
-- index, where with = the planner may walk another claim index and filter (with one busy
-- queue, through all of its jobs).
-- Made by 0013_queue_controls.
CREATE OR REPLACE FUNCTION django_jobs_keyed_candidate(
    p_queues text[], p_closed text[], p_skip_tasks text[], p_passed_keys text[],
    p_passed_ids bigint[]
)
RETURNS TABLE (
    id bigint, priority smallint, run_after timestamptz, queue varchar, concurrency_key varchar,
    concurrency_limit integer
)
LANGUAGE plpgsql STABLE AS $body$#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH RECURSIVE pairs(k, q) AS (
    (SELECT concurrency_key, queue FROM django_jobs_job
     WHERE state = 'pending' AND concurrency_key IS NOT NULL
     ORDER BY concurrency_key, queue LIMIT 1)
    UNION ALL
    SELECT n.concurrency_key, n.queue FROM pairs p CROSS JOIN LATERAL (
        SELECT concurrency_key, queue FROM django_jobs_job
        WHERE state = 'pending' AND concurrency_key IS NOT NULL
          AND (concurrency_key, queue) > (p.k, p.q)
        ORDER BY concurrency_key, queue LIMIT 1
    ) n
)
SELECT j.id, j.priority, j.run_after, j.queue, j.concurrency_key, j.concurrency_limit
FROM pairs p CROSS JOIN LATERAL (
    SELECT j.id, j.priority, j.run_after, j.queue, j.concurrency_key, j.concurrency_limit
    FROM django_jobs_job j
    WHERE j.state = 'pending' AND j.concurrency_key IS NOT NULL
      AND j.concurrency_key >= p.k AND j.concurrency_key <= p.k AND j.queue >= p.q
      AND j.queue <= p.q AND j.run_after <= now()
      AND (p_skip_tasks IS NULL OR j.task <> ALL(p_skip_tasks))
      AND j.id <> ALL(p_passed_ids)
    ORDER BY j.concurrency_key, j.queue, j.priority DESC, j.run_after, j.id
    LIMIT 1
) j
WHERE (p_queues IS NULL OR p.q = ANY(p_queues)) AND p.q <> ALL(p_closed)
  AND p.k <> ALL(p_passed_keys)
  AND j.concurrency_limit > (
      SELECT count(*) FROM django_jobs_job r
      WHERE r.state = 'running' AND r.concurrency_key = p.k
  )
ORDER BY j.priority DESC, j.run_after, j.id
LIMIT 1
;
END
$body$
