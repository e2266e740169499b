-- transition: claim
-- The worker's claim (call_claim of claim.sql, which explains the statement). First, one
-- statement: the branch claim_any_queue, claim_one_queue or claim_some_queues (store.claim_branch
-- reads each out of this file, for its plan), whose guard lets it claim only while none of the
-- worker's queues is paused or limited and no job with a concurrency key waits. The guard is a
-- one-time filter, checked before the statement reads or locks any job; it reads the queue table
-- (a row per paused or limited queue) and job_claim_key_idx, which are empty when no controls are
-- in use, so that the common claim is one statement, as the worker's round trip is one.
-- When that statement claims nothing (no job is ready, or the guard is false), the longer way
-- (queues/controls.py explains the rules):
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
--      slot (the branch claim_keyed_job); a job without a key from its queue's own part of
--      job_claim_free_queue_idx. The one row is locked with SKIP LOCKED as always. A job or key
--      passed over is left out and step 2 runs again, at most ten times.
-- The job without a key is claimed with its queue matched as a range, in the order of
-- job_claim_free_queue_idx, for the reason given in django_jobs_keyed_candidate: with = and a
-- queue that holds most pending jobs, the planner may walk job_claim_free_idx instead and
-- filter on the queue, through every job of a paused or full queue that sorts ahead (version 6).
-- Each branch returns the job's trace_context (the W3C trace context it was enqueued in, as
-- JSON text; NULL without one), which the run's span links to: a column of the row the claim
-- updates anyway, so tracing costs the claim nothing more (version 7 returned no trace context).
-- Version 5 and 6 read the controls first, in two statements of their own, on every claim.
-- Version 9 (0028_time_controls) adds the time controls, none of which costs the common claim
-- a statement or a read:
--   - deadlines: a job whose expires_at has passed is never claimed, by any branch (the worker's
--     and the reaper's expiry pass then end it cancelled);
--   - a queue's rate limit (JOBS_QUEUE_RATE_LIMITS) is a control like a limit: the short
--     branches give way to the longer way, which closes the queue while its window is full, and
--     otherwise takes a start of the queue's window (django_jobs_rate_room, then
--     django_jobs_rate_take once the job is claimed) in the claim's transaction;
--   - a job's rate key: its jobs are keyed (enqueue gives a job with a rate limit and no
--     concurrency key the key 'rate:<rate key>', with no limit on running jobs), so the short
--     branches never take them; the keyed candidate passes over a key whose window is full, and
--     the claim takes a start of the key's window as it does the queue's;
--   - fair queues (JOBS_FAIR_QUEUES): the keyed candidate goes round-robin across their keys.
-- Made by 0028_time_controls.
CREATE OR REPLACE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[], p_skip_tasks text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, lease uuid, trace_context text,
    attempt_id bigint
)
LANGUAGE plpgsql AS $body$#variable_conflict use_column
DECLARE
    v_queues text[] := NULLIF(p_queues, '{}');
    v_closed text[];
    v_limited text[];
    v_rated text[];
    v_fair text[];
    v_rate_limit integer;
    v_rate_period integer;
    v_name text;
    v_passed_keys text[] := '{}';
    v_passed_ids bigint[] := '{}';
    v_keyed record;
    v_free record;
    v_running bigint;
    v_round integer := 0;
BEGIN
    IF v_queues IS NULL THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
          AND (expires_at IS NULL OR expires_at > now())
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
      AND NOT EXISTS (SELECT FROM django_jobs_queue q
                      WHERE (q.paused OR q.concurrency_limit IS NOT NULL
                             OR q.rate_limit IS NOT NULL))
      AND NOT EXISTS (SELECT FROM django_jobs_job k
                      WHERE k.state = 'pending' AND k.concurrency_key IS NOT NULL)
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease, trace_context::text
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
          AND (expires_at IS NULL OR expires_at > now())
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
      AND NOT EXISTS (SELECT FROM django_jobs_queue q
                      WHERE (q.paused OR q.concurrency_limit IS NOT NULL
                             OR q.rate_limit IS NOT NULL) AND q.name = v_queues[1])
      AND NOT EXISTS (SELECT FROM django_jobs_job k
                      WHERE k.state = 'pending' AND k.concurrency_key IS NOT NULL)
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease, trace_context::text
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
          AND (expires_at IS NULL OR expires_at > now())
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
      AND NOT EXISTS (SELECT FROM django_jobs_queue q
                      WHERE (q.paused OR q.concurrency_limit IS NOT NULL
                             OR q.rate_limit IS NOT NULL) AND q.name = ANY(v_queues))
      AND NOT EXISTS (SELECT FROM django_jobs_job k
                      WHERE k.state = 'pending' AND k.concurrency_key IS NOT NULL)
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease, trace_context::text
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    END IF;
    IF FOUND THEN
        RETURN;
    END IF;

    SELECT coalesce(array_agg(q.name ORDER BY q.name) FILTER (WHERE q.paused), '{}'),
           coalesce(array_agg(q.name ORDER BY q.name)
                    FILTER (WHERE NOT q.paused AND q.concurrency_limit IS NOT NULL), '{}'),
           coalesce(array_agg(q.name ORDER BY q.name)
                    FILTER (WHERE NOT q.paused AND q.rate_limit IS NOT NULL), '{}'),
           coalesce(array_agg(q.name ORDER BY q.name) FILTER (WHERE q.fair), '{}')
    INTO v_closed, v_limited, v_rated, v_fair
    FROM django_jobs_queue q
    WHERE (q.paused OR q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL OR q.fair)
      AND (v_queues IS NULL OR q.name = ANY(v_queues));
    -- A rate-limited queue whose window is full is closed until its free_at.
    IF cardinality(v_rated) > 0 THEN
        v_closed := v_closed || ARRAY(
            SELECT q.name::text FROM django_jobs_queue q
            JOIN django_jobs_rate w ON w.key = 'queue:' || q.name
            WHERE q.name = ANY(v_rated) AND w.free_at > now()
              AND w.rate_limit = q.rate_limit AND w.rate_period = q.rate_period
        );
    END IF;
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

    LOOP
        v_round := v_round + 1;
        IF v_round > 10 THEN
            RETURN;
        END IF;
        SELECT * INTO v_keyed FROM django_jobs_keyed_candidate(v_queues, v_closed, p_skip_tasks,
                                                               v_passed_keys, v_passed_ids,
                                                               v_fair);
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
            -- The rate windows, the queue's and then the key's: each row is locked until the
            -- claim commits, and a start is recorded in each once the job is claimed.
            v_rate_limit := NULL;
            IF v_keyed.queue = ANY(v_rated) THEN
                SELECT q.rate_limit, q.rate_period INTO v_rate_limit, v_rate_period
                FROM django_jobs_queue q WHERE q.name = v_keyed.queue;
                IF NOT django_jobs_rate_room('queue:' || v_keyed.queue, v_rate_limit,
                                             v_rate_period) THEN
                    v_closed := v_closed || v_keyed.queue::text;
                    CONTINUE;
                END IF;
            END IF;
            IF v_keyed.rate_key IS NOT NULL AND NOT django_jobs_rate_room(
                'key:' || v_keyed.rate_key, v_keyed.rate_limit, v_keyed.rate_period
            ) THEN
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
          AND (expires_at IS NULL OR expires_at > now())
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease, trace_context::text
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
            IF FOUND THEN
                IF v_rate_limit IS NOT NULL THEN
                    PERFORM django_jobs_rate_take('queue:' || v_keyed.queue,
                                                  v_rate_limit,
                                                  v_rate_period);
                END IF;
                IF v_keyed.rate_key IS NOT NULL THEN
                    PERFORM django_jobs_rate_take('key:' || v_keyed.rate_key, v_keyed.rate_limit,
                                                  v_keyed.rate_period);
                END IF;
                RETURN;
            END IF;
            v_passed_ids := v_passed_ids || v_keyed.id;
        ELSIF v_free.id IS NOT NULL THEN
            v_rate_limit := NULL;
            IF v_free.queue = ANY(v_rated) THEN
                SELECT q.rate_limit, q.rate_period INTO v_rate_limit, v_rate_period
                FROM django_jobs_queue q WHERE q.name = v_free.queue;
                IF NOT django_jobs_rate_room('queue:' || v_free.queue, v_rate_limit,
                                             v_rate_period) THEN
                    v_closed := v_closed || v_free.queue::text;
                    CONTINUE;
                END IF;
            END IF;
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
          AND queue >= v_free.queue AND queue <= v_free.queue
          AND (expires_at IS NULL OR expires_at > now())
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY queue, priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease, trace_context::text
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
            IF FOUND THEN
                IF v_rate_limit IS NOT NULL THEN
                    PERFORM django_jobs_rate_take('queue:' || v_free.queue,
                                                  v_rate_limit,
                                                  v_rate_period);
                END IF;
                RETURN;
            END IF;
            v_closed := v_closed || v_free.queue::text;
        ELSE
            RETURN;
        END IF;
    END LOOP;
END
$body$
