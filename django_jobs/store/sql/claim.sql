-- The claim: a worker takes the next ready job. Workers run it inside django_jobs_claim()
-- (functions.sql) through call_claim; the three statements below are its three branches, as
-- statements of their own for reading their plans (transitions.claim_sql: the tests, the bench).
-- tests/test_transitions.py checks that they are the function's branches.
--
-- Pick the first ready pending job in (priority DESC, run_after, id) order, lock it with SKIP
-- LOCKED so concurrent workers pass over each other, mark it running, count the attempt and draw
-- a new lease token, and open its Attempt row: one statement, one round trip. The lock is FOR NO
-- KEY UPDATE, the mode the UPDATE takes anyway: it excludes other claims and finishes of the
-- job, but not the FOR KEY SHARE that a foreign key check takes on it while a dependent or a
-- child of the job is being enqueued in a transaction that may stay open. Jobs of skip_tasks
-- (tasks the worker has found it does not have) are passed over.
--
-- Jobs with a concurrency key, and queues that are paused or limited, take the function's
-- longer way (functions.sql); these statements claim jobs without a key only, so that a job
-- with a key is never claimed without its key's lock. claim_keyed_job is the claim of a keyed
-- candidate once its key's slot is secured.

-- name: call_claim
-- The worker's claim: one job for worker_id from queues (NULL: every queue), or no row.
SELECT * FROM django_jobs_claim(%(worker_id)s::text, %(queues)s::text[], %(skip_tasks)s::text[])

-- name: claim_any_queue
-- transition: claim
-- Index: job_claim_free_idx, partial on pending jobs without a concurrency key, so finished
-- jobs cost nothing however many there are.
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
                               started_at = now(), finished_at = NULL, cancel_requested = false,
                               lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
          AND (%(skip_tasks)s::text[] IS NULL OR task <> ALL(%(skip_tasks)s::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error,
                                     traceback, lease)
    SELECT id, attempt, %(worker_id)s, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened

-- name: claim_one_queue
-- transition: claim
-- Index: job_claim_free_queue_idx, partial on pending jobs without a concurrency key.
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
                               started_at = now(), finished_at = NULL, cancel_requested = false,
                               lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
          AND queue = %(queue)s
          AND (%(skip_tasks)s::text[] IS NULL OR task <> ALL(%(skip_tasks)s::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error,
                                     traceback, lease)
    SELECT id, attempt, %(worker_id)s, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened

-- name: claim_some_queues
-- transition: claim
-- Index: job_claim_free_queue_idx, partial on pending jobs without a concurrency key.
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
                               started_at = now(), finished_at = NULL, cancel_requested = false,
                               lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
          AND queue = ANY(%(queues)s)
          AND (%(skip_tasks)s::text[] IS NULL OR task <> ALL(%(skip_tasks)s::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error,
                                     traceback, lease)
    SELECT id, attempt, %(worker_id)s, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened

-- name: claim_keyed_job
-- transition: claim
-- The claim of the keyed candidate %(job_id)s (django_jobs_keyed_candidate), once its key's
-- lock is held and a slot counted free: the same claim, of that one job if it is still pending,
-- ready and not locked by another claim. Index: the primary key.
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
                               started_at = now(), finished_at = NULL, cancel_requested = false,
                               lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE id = %(job_id)s AND state = 'pending' AND run_after <= now()
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error,
                                     traceback, lease)
    SELECT id, attempt, %(worker_id)s, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened

-- name: keyed_candidate
-- The keyed candidate of a claim, for reading its plan (functions.sql has the function).
SELECT * FROM django_jobs_keyed_candidate(%(queues)s::text[], %(closed)s::text[],
                                          %(skip_tasks)s::text[], '{}', '{}')

-- name: free_candidate
-- The candidate without a key, for reading its plan.
SELECT * FROM django_jobs_free_candidate(%(queues)s::text[], %(closed)s::text[],
                                         %(skip_tasks)s::text[])
