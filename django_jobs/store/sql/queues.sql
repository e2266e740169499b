-- Queue controls (queues/controls.py): the rows of django_jobs_queue that the claim function reads on
-- every claim (functions/django_jobs_claim_v*.sql). A queue without a row is open and has no limit.

-- name: known_queues
-- The queues something names: controls, live workers, unfinished jobs. Queues of pending jobs
-- without a key by a skip scan of job_claim_free_queue_idx (one probe per queue, however many
-- jobs wait); of pending jobs with a key, from job_claim_key_idx.
WITH RECURSIVE pending(q) AS (
    (SELECT queue::text FROM django_jobs_job
     WHERE state = 'pending' AND concurrency_key IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue::text FROM django_jobs_job
            WHERE state = 'pending' AND concurrency_key IS NULL AND queue > p.q
            ORDER BY queue LIMIT 1)
    FROM pending p WHERE p.q IS NOT NULL
)
SELECT q FROM pending WHERE q IS NOT NULL
UNION SELECT queue FROM django_jobs_job WHERE state = 'pending' AND concurrency_key IS NOT NULL
UNION SELECT name FROM django_jobs_queue
UNION SELECT queue FROM django_jobs_job WHERE state IN ('running', 'waiting')
UNION SELECT jsonb_array_elements_text(queues) FROM django_jobs_worker
      WHERE jsonb_typeof(queues) = 'array'

-- name: pause_queue
-- The next claim passes over the queue. Pausing a paused queue keeps its first pause's time.
INSERT INTO django_jobs_queue (name, paused, paused_at, paused_by, pause_reason, limit_source,
                               updated_at)
VALUES (%(name)s, true, now(), %(by)s, %(reason)s, '', now())
ON CONFLICT (name) DO UPDATE
SET paused = true,
    paused_at = CASE WHEN django_jobs_queue.paused THEN django_jobs_queue.paused_at ELSE now() END,
    paused_by = EXCLUDED.paused_by, pause_reason = EXCLUDED.pause_reason, updated_at = now()

-- name: resume_queue
-- Claims take the queue's jobs again; idle workers are woken for them (at commit).
UPDATE django_jobs_queue
SET paused = false, paused_at = NULL, paused_by = '', pause_reason = '', updated_at = now()
WHERE name = %(name)s
RETURNING pg_notify('django_jobs', name) IS NULL

-- name: queue_is_paused
-- Whether the queue is paused now (a scheduler's tick skips it). Index: the primary key.
SELECT EXISTS (SELECT 1 FROM django_jobs_queue WHERE name = %(name)s AND paused)

-- name: set_queue_limit
-- A limit from the admin or jobqueue, or NULL for none. Idle workers are woken: a higher limit
-- frees slots.
INSERT INTO django_jobs_queue (name, concurrency_limit, limit_source, updated_at)
VALUES (%(name)s, %(limit)s, %(source)s, now())
ON CONFLICT (name) DO UPDATE
SET concurrency_limit = EXCLUDED.concurrency_limit, limit_source = EXCLUDED.limit_source,
    updated_at = now()
RETURNING pg_notify('django_jobs', name) IS NULL

-- name: sync_queue_limits
-- JOBS_QUEUE_LIMITS into the table: %(names)s with %(limits)s. Limits that came from settings
-- follow them (and go when the setting does); a limit set in the admin or by jobqueue stays.
WITH wanted AS (
    SELECT * FROM unnest(%(names)s::text[], %(limits)s::int[]) AS w(name, concurrency_limit)
), upserted AS (
    INSERT INTO django_jobs_queue (name, concurrency_limit, limit_source, updated_at)
    SELECT name, concurrency_limit, 'settings', now() FROM wanted
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = EXCLUDED.concurrency_limit, limit_source = 'settings',
        updated_at = now()
    WHERE django_jobs_queue.limit_source <> 'admin'
      AND django_jobs_queue.concurrency_limit IS DISTINCT FROM EXCLUDED.concurrency_limit
)
UPDATE django_jobs_queue q
SET concurrency_limit = NULL, limit_source = '', updated_at = now()
WHERE q.limit_source = 'settings' AND q.name NOT IN (SELECT name FROM wanted)

-- name: queue_states
-- The queues %(names)s with their controls and their pending and running counts (pending by
-- job_claim_free_queue_idx and job_claim_key_idx, running by job_running_worker_idx).
SELECT c.name, coalesce(q.paused, false), q.paused_at, coalesce(q.paused_by, ''),
       coalesce(q.pause_reason, ''), q.concurrency_limit, coalesce(q.limit_source, ''),
       (SELECT count(*) FROM django_jobs_job j
        WHERE j.state = 'pending' AND j.concurrency_key IS NULL AND j.queue = c.name)
       + (SELECT count(*) FROM django_jobs_job j
          WHERE j.state = 'pending' AND j.concurrency_key IS NOT NULL AND j.queue = c.name),
       (SELECT count(*) FROM django_jobs_job j WHERE j.state = 'running' AND j.queue = c.name)
FROM unnest(%(names)s::text[]) AS c(name)
LEFT JOIN django_jobs_queue q ON q.name = c.name
ORDER BY c.name

-- name: sync_queue_rates
-- JOBS_QUEUE_RATE_LIMITS and JOBS_FAIR_QUEUES into the table: %(names)s with %(limits)s starts
-- per %(periods)s seconds, and %(fair)s the fair queues. Rates that came from settings follow
-- them (and go when the setting does); a rate set in the admin or by jobqueue stays. A queue is
-- fair exactly while JOBS_FAIR_QUEUES names it.
WITH wanted AS (
    SELECT * FROM unnest(%(names)s::text[], %(limits)s::int[], %(periods)s::int[])
        AS w(name, rate_limit, rate_period)
), fair AS (
    SELECT unnest(%(fair)s::text[]) AS name
), upserted AS (
    INSERT INTO django_jobs_queue (name, rate_limit, rate_period, rate_source, fair, updated_at)
    SELECT coalesce(w.name, f.name), w.rate_limit, w.rate_period,
           CASE WHEN w.name IS NOT NULL THEN 'settings' ELSE '' END, f.name IS NOT NULL, now()
    FROM wanted w FULL JOIN fair f ON f.name = w.name
    ON CONFLICT (name) DO UPDATE
    SET rate_limit = CASE WHEN django_jobs_queue.rate_source = 'admin'
                          THEN django_jobs_queue.rate_limit ELSE EXCLUDED.rate_limit END,
        rate_period = CASE WHEN django_jobs_queue.rate_source = 'admin'
                           THEN django_jobs_queue.rate_period ELSE EXCLUDED.rate_period END,
        rate_source = CASE WHEN django_jobs_queue.rate_source = 'admin' THEN 'admin'
                           WHEN EXCLUDED.rate_limit IS NULL THEN '' ELSE 'settings' END,
        fair = EXCLUDED.fair, updated_at = now()
    WHERE (django_jobs_queue.rate_source <> 'admin'
           AND (django_jobs_queue.rate_limit, django_jobs_queue.rate_period)
               IS DISTINCT FROM (EXCLUDED.rate_limit, EXCLUDED.rate_period))
       OR django_jobs_queue.fair IS DISTINCT FROM EXCLUDED.fair
)
UPDATE django_jobs_queue q
SET rate_limit = CASE WHEN q.rate_source = 'settings' THEN NULL ELSE q.rate_limit END,
    rate_period = CASE WHEN q.rate_source = 'settings' THEN NULL ELSE q.rate_period END,
    rate_source = CASE WHEN q.rate_source = 'settings' THEN '' ELSE q.rate_source END,
    fair = false, updated_at = now()
WHERE (q.rate_source = 'settings' OR q.fair)
  AND q.name NOT IN (SELECT name FROM wanted UNION SELECT name FROM fair)

-- name: set_queue_rate
-- A rate limit from the admin or jobqueue (%(limit)s starts per %(period)s seconds), or NULLs
-- for none. Idle workers are woken: a higher rate frees starts.
INSERT INTO django_jobs_queue (name, rate_limit, rate_period, rate_source, updated_at)
VALUES (%(name)s, %(limit)s, %(period)s, %(source)s, now())
ON CONFLICT (name) DO UPDATE
SET rate_limit = EXCLUDED.rate_limit, rate_period = EXCLUDED.rate_period,
    rate_source = EXCLUDED.rate_source, updated_at = now()
RETURNING pg_notify('django_jobs', name) IS NULL
