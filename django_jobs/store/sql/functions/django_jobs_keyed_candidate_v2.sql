-- The claim's keyed candidate (see django_jobs_claim): the first ready job, in claim order, of
-- the (key, queue) pairs of the open queues whose key has a free slot. A skip scan of
-- job_claim_key_idx finds the pairs (one probe each), then one probe finds each pair's first
-- ready job and one count of job_running_key_idx its key's running jobs. The count is read
-- without a lock: the claim counts again under the key's lock before it takes the slot. The
-- pair is matched as a range (>= and <=), not with =, and the order names the index's leading
-- columns: a plan made before the pair is known must then read the pair's own part of the
-- index, where with = the planner may walk another claim index and filter (with one busy
-- queue, through all of its jobs).
-- Version 2 adds the time controls of 0028_time_controls:
--   - a job past its deadline (expires_at) is never a candidate;
--   - a pair whose first job's rate key is full (its django_jobs_rate row's free_at is still
--     ahead, for the job's own limit) is passed over, by the primary key of that small table:
--     its jobs wait as pending, and no job of theirs is locked;
--   - in the queues p_fair (JOBS_FAIR_QUEUES) the pairs go round-robin: the key with the fewest
--     running jobs first, and only then claim order, so one key's backlog delays another key's
--     job by at most one claim per slot. Elsewhere a pair counts as a key with none running.
--     The cost is a probe per pair, as before: it follows the number of keys, not their
--     backlog.
-- Made by 0028_time_controls.
CREATE OR REPLACE FUNCTION django_jobs_keyed_candidate(
    p_queues text[], p_closed text[], p_skip_tasks text[], p_passed_keys text[],
    p_passed_ids bigint[], p_fair text[]
)
RETURNS TABLE (
    id bigint, priority smallint, run_after timestamptz, queue varchar, concurrency_key varchar,
    concurrency_limit integer, rate_key varchar, rate_limit integer, rate_period integer
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
SELECT j.id, j.priority, j.run_after, j.queue, j.concurrency_key, j.concurrency_limit,
       j.rate_key, j.rate_limit, j.rate_period
FROM pairs p CROSS JOIN LATERAL (
    SELECT j.id, j.priority, j.run_after, j.queue, j.concurrency_key, j.concurrency_limit,
           j.rate_key, j.rate_limit, j.rate_period
    FROM django_jobs_job j
    WHERE j.state = 'pending' AND j.concurrency_key IS NOT NULL
      AND j.concurrency_key >= p.k AND j.concurrency_key <= p.k AND j.queue >= p.q
      AND j.queue <= p.q AND j.run_after <= now()
      AND (j.expires_at IS NULL OR j.expires_at > now())
      AND (p_skip_tasks IS NULL OR j.task <> ALL(p_skip_tasks))
      AND j.id <> ALL(p_passed_ids)
    ORDER BY j.concurrency_key, j.queue, j.priority DESC, j.run_after, j.id
    LIMIT 1
) j CROSS JOIN LATERAL (
    SELECT count(*) AS running FROM django_jobs_job r
    WHERE r.state = 'running' AND r.concurrency_key = p.k
) busy
WHERE (p_queues IS NULL OR p.q = ANY(p_queues)) AND p.q <> ALL(p_closed)
  AND p.k <> ALL(p_passed_keys)
  AND j.concurrency_limit > busy.running
  AND (j.rate_key IS NULL OR NOT EXISTS (
      SELECT FROM django_jobs_rate w
      WHERE w.key = 'key:' || j.rate_key AND w.free_at > now()
        AND w.rate_limit = j.rate_limit AND w.rate_period = j.rate_period
  ))
ORDER BY CASE WHEN p.q = ANY(p_fair) THEN busy.running ELSE 0 END,
         j.priority DESC, j.run_after, j.id
LIMIT 1
;
END
$body$
