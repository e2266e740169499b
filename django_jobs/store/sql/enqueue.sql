-- Putting jobs in the table (enqueue.py). These run on Django's connection, inside the caller's
-- transaction if there is one. The COPY of a bulk enqueue is the one statement not here: its
-- column list depends on the jobs (enqueue._COPY).

-- name: insert_plain_job
-- transition: enqueue
-- One new job without a unique key or a parent, the common case: insert_job without the two
-- clauses that only those need. With a NULL unique key the arbiter index (a partial index of
-- non-NULL keys) can never conflict, and with no parent there is no parent's attempt to read;
-- each clause, though, costs PostgreSQL planning time on every enqueue (the arbiter inference
-- and the subquery each open every index of the table), which this statement, planned afresh
-- on each call like every statement on Django's connection, does without: it plans in about a
-- quarter of insert_job's time. Everything else is insert_job's, the NOTIFY included.
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, max_attempts, timeout,
                             run_after, error, finished_at, concurrency_key, concurrency_limit,
                             trace_context, rate_key, rate_limit, rate_period, expires_at)
VALUES (%(task)s, %(queue)s, %(priority)s, %(state)s, %(args)s::jsonb, %(kwargs)s::jsonb,
        %(max_attempts)s, %(timeout)s,
        COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
        %(reason)s, CASE WHEN %(state)s = 'cancelled' THEN now() END,
        %(concurrency_key)s, %(concurrency_limit)s, %(trace_context)s::jsonb,
        %(rate_key)s, %(rate_limit)s, %(rate_period)s,
        COALESCE(%(expires_at)s::timestamptz,
                 now() + make_interval(secs => %(expires_after)s::float8)))
RETURNING id, state, attempt, run_after, created_at, finished_at, parent_attempt,
    (CASE WHEN state = 'pending' AND run_after <= now()
          THEN pg_notify('django_jobs', queue) END) IS NULL AS notified, expires_at

-- name: insert_job
-- transition: enqueue
-- One new job. run_after is a given timestamp or the database clock plus a delay, never an app
-- clock; now() is the transaction's clock, which the claim compares run_after with. A unique
-- key that an active job holds inserts nothing (the caller then looks that job up).
-- The last column wakes idle workers (LISTEN in worker/wakeup.py) when the job is ready now:
-- the notification is delivered when the enqueueing transaction commits, and never if it rolls
-- back. It carries only the queue name. trace_context is the W3C trace context of the span the
-- job is enqueued in (runtime/tracing.py), NULL outside one. expires_at is a given deadline or
-- the database clock plus expires_after seconds (NULL: none); rate_key, rate_limit and
-- rate_period are the job's rate limit (rates.py).
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, max_attempts, timeout,
                             run_after, parent_id, parent_attempt, unique_key, error, finished_at,
                             concurrency_key, concurrency_limit, trace_context, rate_key,
                             rate_limit, rate_period, expires_at)
VALUES (%(task)s, %(queue)s, %(priority)s, %(state)s, %(args)s::jsonb, %(kwargs)s::jsonb,
        %(max_attempts)s, %(timeout)s,
        COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
        %(parent)s, (SELECT p.attempt FROM django_jobs_job p WHERE p.id = %(parent)s),
        %(unique_key)s, %(reason)s,
        CASE WHEN %(state)s = 'cancelled' THEN now() END,
        %(concurrency_key)s, %(concurrency_limit)s, %(trace_context)s::jsonb,
        %(rate_key)s, %(rate_limit)s, %(rate_period)s,
        COALESCE(%(expires_at)s::timestamptz,
                 now() + make_interval(secs => %(expires_after)s::float8)))
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                           AND state IN ('waiting', 'pending', 'running')
DO NOTHING
RETURNING id, state, attempt, run_after, created_at, finished_at, parent_attempt,
    (CASE WHEN state = 'pending' AND run_after <= now()
          THEN pg_notify('django_jobs', queue) END) IS NULL AS notified, expires_at

-- name: reserve_jobs
-- Bulk enqueue writes its rows with COPY, the fastest way into a table. First, in this
-- statement, it takes the rows' ids from the table's identity sequence and the values every row
-- shares from the database clock (run_after, created_at, and finished_at for jobs born
-- cancelled), and asks for the wake-up of idle workers if the jobs are ready now (delivered at
-- commit, like every NOTIFY). Then one COPY writes all the rows, in the same transaction.
SELECT ARRAY(SELECT nextval(pg_get_serial_sequence('django_jobs_job', 'id'))
             FROM generate_series(1, %(count)s)) AS ids,
       r.run_after, statement_timestamp() AS created_at,
       CASE WHEN %(state)s = 'cancelled' THEN now() END AS finished_at,
       (CASE WHEN %(state)s = 'pending' AND r.run_after <= now()
             THEN pg_notify('django_jobs', %(queue)s) END) IS NULL AS notified,
       (SELECT p.attempt FROM django_jobs_job p WHERE p.id = %(parent)s) AS parent_attempt,
       COALESCE(%(expires_at)s::timestamptz,
                now() + make_interval(secs => %(expires_after)s::float8)) AS expires_at
FROM (SELECT COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s))
             AS run_after) r

-- name: copy_jobs
-- transition: enqueue
-- Bulk enqueue's rows, after reserve_jobs: their ids, their arguments, and the values they share
-- that differ from the columns' defaults, which enqueue_many names in the column list
-- ({columns}, filled in before it runs). Run with psycopg's COPY protocol, in the transaction of
-- reserve_jobs.
COPY django_jobs_job ({columns}) FROM STDIN

-- name: read_dependencies
-- The dependencies' states, read without a lock: the enqueueing transaction may stay open for
-- as long as the application likes, and must not hold back the dependencies' finishes (the
-- dependency rows' foreign keys take only FOR KEY SHARE, which a finish does not wait for). A
-- dependency that ends while the transaction is open cannot see the new dependent, so the new
-- jobs are checked again once the transaction has committed (settle_new in workflows.sql).
SELECT id, state, task FROM django_jobs_job WHERE id = ANY(%(ids)s) ORDER BY id

-- name: insert_dependencies
-- Every new job depends on every one of the dependencies.
INSERT INTO django_jobs_dependency (job_id, depends_on_id)
SELECT j, d FROM unnest(%(job_ids)s::bigint[]) AS j
CROSS JOIN unnest(%(dependency_ids)s::bigint[]) AS d

-- name: find_active_unique
-- The active job that holds a unique key. Index: job_admin_unique_key_idx.
SELECT id FROM django_jobs_job
WHERE unique_key = %(unique_key)s AND state IN ('waiting', 'pending', 'running')

-- name: parent_exists
SELECT 1 FROM django_jobs_job WHERE id = %(parent)s

-- name: analyze_jobs
-- After a bulk enqueue of a large fan-out: until autovacuum next analyzes them (a minute or
-- more later), the planner would think the new fan-out tiny, and page through it with plans
-- that read all of it for every page.
ANALYZE django_jobs_job, django_jobs_dependency

-- name: deadline_passed
-- Whether a deadline given at enqueue has passed by the database's clock (enqueue refuses it).
SELECT %(expires_at)s::timestamptz <= now()
