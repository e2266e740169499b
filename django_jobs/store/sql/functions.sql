-- The PL/pgSQL functions on the worker's hot path, as the latest migration that makes them
-- (0013_queue_controls) created them; tests/integration/test_transitions.py checks that the
-- migration and the database agree with this file. A change here needs a new migration that
-- replaces the function: copy the text into it, and restart the workers after migrating.
--
-- PostgreSQL keeps a function's plans for the life of its connection, so a worker does not pay
-- for planning these statements on every job, and nothing is prepared on the protocol, which
-- pgbouncer in transaction mode would break. The workers call them with call_claim and
-- call_finish (claim.sql, ending.sql).

-- name: django_jobs_claim
-- transition: claim
-- The claim of claim.sql. With no queue paused or limited and no job with a concurrency key
-- waiting, one statement: claim_any_queue, claim_one_queue or claim_some_queues, with the
-- function's arguments for their parameters. Otherwise (queues.py explains the rules):
--   1. the queue controls: paused queues are closed; each limited queue is locked (an
--      advisory lock held until the claim commits, taken in name order) and then its running
--      jobs counted, so claims that might take its last slot take turns and each counts what
--      the one before committed; a full queue is closed;
--   2. the first ready job of each (key, queue) whose key has a free slot (keyed_candidate),
--      and the first ready job without a key of each open queue (free_candidate): skip scans
--      of the indexes, one probe per key and per queue, so jobs that wait for a slot are never
--      walked;
--   3. the earlier of the two is claimed. A keyed job only once its key's advisory lock is
--      taken (a try: a key being claimed by another worker is passed over, never waited for)
--      and, in a new statement that sees every claim committed before, its key still has a free
--      slot; a job without a key by claim_one_queue on its queue. The one row is locked with
--      SKIP LOCKED as always. A job or key passed over is left out and step 2 runs again, at
--      most ten times.
CREATE OR REPLACE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[], p_skip_tasks text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, lease uuid, attempt_id bigint
)
LANGUAGE plpgsql AS $body$#variable_conflict use_column
DECLARE
    v_queues text[] := NULLIF(p_queues, '{}');
    v_closed text[];
    v_limited text[];
    v_name text;
    v_passed_keys text[] := '{}';
    v_passed_ids bigint[] := '{}';
    v_keyed record;
    v_free record;
    v_running bigint;
    v_round integer := 0;
BEGIN
    SELECT coalesce(array_agg(q.name ORDER BY q.name) FILTER (WHERE q.paused), '{}'),
           coalesce(array_agg(q.name ORDER BY q.name) FILTER (WHERE NOT q.paused), '{}')
    INTO v_closed, v_limited
    FROM django_jobs_queue q
    WHERE (q.paused OR q.concurrency_limit IS NOT NULL)
      AND (v_queues IS NULL OR q.name = ANY(v_queues));
    IF cardinality(v_limited) > 0 THEN
        FOREACH v_name IN ARRAY v_limited LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('django_jobs.queue:' || v_name, 0));
        END LOOP;
        v_closed := v_closed || ARRAY(
            SELECT q.name::text FROM django_jobs_queue q
            WHERE q.name = ANY(v_limited) AND q.concurrency_limit <= (
                SELECT count(*) FROM django_jobs_job r WHERE r.state = 'running' AND r.queue = q.name
            )
        );
    END IF;

    IF cardinality(v_closed) = 0 AND NOT EXISTS (
        SELECT 1 FROM django_jobs_job k WHERE k.state = 'pending' AND k.concurrency_key IS NOT NULL
    ) THEN
        IF v_queues IS NULL THEN
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
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
        ELSIF cardinality(v_queues) = 1 THEN
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL AND queue = v_queues[1]
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
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL AND queue = ANY(v_queues)
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
        RETURN;
    END IF;

    LOOP
        v_round := v_round + 1;
        IF v_round > 10 THEN
            RETURN;
        END IF;
        SELECT * INTO v_keyed FROM django_jobs_keyed_candidate(v_queues, v_closed, p_skip_tasks,
                                                               v_passed_keys, v_passed_ids);
        SELECT * INTO v_free FROM django_jobs_free_candidate(v_queues, v_closed, p_skip_tasks);
        IF v_keyed.id IS NOT NULL AND (
            v_free.id IS NULL OR v_keyed.priority > v_free.priority
            OR (v_keyed.priority = v_free.priority
                AND (v_keyed.run_after, v_keyed.id) < (v_free.run_after, v_free.id))
        ) THEN
            IF NOT pg_try_advisory_xact_lock(
                hashtextextended('django_jobs.key:' || v_keyed.concurrency_key, 0)
            ) THEN
                v_passed_keys := v_passed_keys || v_keyed.concurrency_key::text;
                CONTINUE;
            END IF;
            SELECT count(*) INTO v_running FROM django_jobs_job r
            WHERE r.state = 'running' AND r.concurrency_key = v_keyed.concurrency_key;
            IF v_running >= v_keyed.concurrency_limit THEN
                v_passed_keys := v_passed_keys || v_keyed.concurrency_key::text;
                CONTINUE;
            END IF;
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE id = v_keyed.id AND state = 'pending' AND run_after <= now()
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
            IF FOUND THEN
                RETURN;
            END IF;
            v_passed_ids := v_passed_ids || v_keyed.id;
        ELSIF v_free.id IS NOT NULL THEN
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL AND queue = v_free.queue
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
            IF FOUND THEN
                RETURN;
            END IF;
            v_closed := v_closed || v_free.queue::text;
        ELSE
            RETURN;
        END IF;
    END LOOP;
END
$body$
;

-- name: django_jobs_keyed_candidate
-- The claim's keyed candidate (see django_jobs_claim): the first ready job, in claim order, of
-- the (key, queue) pairs of the open queues whose key has a free slot. A skip scan of
-- job_claim_key_idx finds the pairs (one probe each), then one probe finds each pair's first
-- ready job and one count of job_running_key_idx its key's running jobs. The count is read
-- without a lock: the claim counts again under the key's lock before it takes the slot. The
-- pair is matched as a range (>= and <=), not with =, and the order names the index's leading
-- columns: a plan made before the pair is known must then read the pair's own part of the
-- index, where with = the planner may walk another claim index and filter (with one busy
-- queue, through all of its jobs).
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
;

-- name: django_jobs_free_candidate
-- The claim's candidate without a key (see django_jobs_claim): the first ready job without a
-- key of each open queue (a skip scan of job_claim_free_queue_idx, one probe per queue), the
-- first of them in claim order. Read without a lock: claim_one_queue then claims on its queue.
-- The queue is matched as a range for the reason given in django_jobs_keyed_candidate.
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
