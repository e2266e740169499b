-- Operators' actions over a small batch of ids (the admin, Job.cancel(), retry(), run_now()).
-- Each locks its rows SKIP LOCKED and returns the ids another transaction held as 'busy', for
-- the caller to try again (store.control.until_free).

-- name: cancel_many
-- transition: cancel
-- A pending or waiting job ends at once; a running one is flagged, and its worker stops it at
-- its next heartbeat. Also says whether each job has children or dependents, for the cascade
-- (workflows.cancel_with_cascade). The SET list is the one of cancel_children
-- (workflows.sql).
-- Index: the primary key; job_parent_idx and dependency_depends_on_idx for the two EXISTS.
WITH locked AS (
    SELECT j.id FROM django_jobs_job j
    WHERE j.id = ANY(%(ids)s) AND j.state IN ('waiting', 'pending', 'running')
    FOR NO KEY UPDATE SKIP LOCKED
), changed AS (
    UPDATE django_jobs_job j
    SET state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
        cancel_requested = true,
        finished_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        error = CASE WHEN j.state = 'running' THEN j.error ELSE %(reason)s END
    FROM locked
    WHERE j.id = locked.id AND j.state IN ('waiting', 'pending', 'running')
    RETURNING j.id, j.state,
              EXISTS (SELECT 1 FROM django_jobs_job c WHERE c.parent_id = j.id)
              OR EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = j.id)
)
SELECT id, state, linked FROM changed AS c(id, state, linked)
UNION ALL
SELECT j.id, 'busy', false FROM django_jobs_job j
WHERE j.id = ANY(%(ids)s) AND j.state IN ('waiting', 'pending', 'running')
  AND j.id NOT IN (SELECT id FROM locked)

-- name: retry_many
-- transition: retry
-- A job that ended in error or was cancelled goes back to pending, ready now, with a fresh
-- budget of attempts (ids and budgets, in the same order); refused while one of its
-- dependencies is not done, or while another active job holds its unique key (and of several
-- jobs in the batch with one key, only the first goes).
-- Index: the primary key; job_admin_unique_key_idx for the unique keys.
WITH locked AS (
    SELECT j.id, j.unique_key FROM django_jobs_job j
    WHERE j.id = ANY(%(ids)s) AND j.state IN ('error', 'cancelled')
    FOR NO KEY UPDATE SKIP LOCKED
), eligible AS (
    SELECT DISTINCT ON (l.unique_key, CASE WHEN l.unique_key IS NULL THEN l.id END) l.id
    FROM locked l
    WHERE NOT EXISTS (
        SELECT 1 FROM django_jobs_dependency d JOIN django_jobs_job dj ON dj.id = d.depends_on_id
        WHERE d.job_id = l.id AND dj.state <> 'done')
      AND NOT EXISTS (
        SELECT 1 FROM django_jobs_job o
        WHERE o.unique_key = l.unique_key AND o.id <> l.id
          AND o.state IN ('waiting', 'pending', 'running'))
    ORDER BY l.unique_key, CASE WHEN l.unique_key IS NULL THEN l.id END, l.id
), changed AS (
    UPDATE django_jobs_job j
    SET state = 'pending', max_attempts = j.attempt + b.budget, run_after = now(),
        finished_at = NULL, worker_id = NULL, cancel_requested = false, result = NULL,
        error = ''
    FROM eligible e, unnest(%(ids)s::bigint[], %(budgets)s::int[]) AS b(id, budget)
    WHERE j.id = e.id AND b.id = e.id
    RETURNING j.id, pg_notify('django_jobs', j.queue) IS NULL
)
SELECT id, 'requeued' AS what FROM changed
UNION ALL
SELECT j.id, 'busy' FROM django_jobs_job j
WHERE j.id = ANY(%(ids)s) AND j.state IN ('error', 'cancelled')
  AND j.id NOT IN (SELECT id FROM locked)

-- name: unique_key_holders
-- Who holds the unique keys of these jobs: another active job with the same key. For the
-- message of a retry that was refused. Index: job_admin_unique_key_idx.
SELECT j.id AS job_id, j.unique_key, o.id AS holder_id, o.state AS holder_state
FROM django_jobs_job j
JOIN django_jobs_job o ON o.unique_key = j.unique_key AND o.id <> j.id
WHERE j.id = ANY(%(ids)s) AND o.state IN ('waiting', 'pending', 'running')

-- name: run_now_many
-- transition: run now
-- A pending job scheduled for later becomes ready at once. Index: the primary key.
WITH locked AS (
    SELECT j.id FROM django_jobs_job j WHERE j.id = ANY(%(ids)s) AND j.state = 'pending'
    FOR NO KEY UPDATE SKIP LOCKED
), changed AS (
    UPDATE django_jobs_job j SET run_after = now()
    FROM locked WHERE j.id = locked.id AND j.state = 'pending'
    RETURNING j.id, pg_notify('django_jobs', j.queue) IS NULL
)
SELECT id, 'ready' AS what FROM changed
UNION ALL
SELECT j.id, 'busy' FROM django_jobs_job j
WHERE j.id = ANY(%(ids)s) AND j.state = 'pending' AND j.id NOT IN (SELECT id FROM locked)

-- name: expire_due
-- transition: expire
-- Pending jobs whose deadline (expires_at) has passed, by the database's clock, end cancelled
-- with a reason that says so: %(limit)s at most, soonest deadline first, locked SKIP LOCKED (a
-- job another transaction holds is left for the next pass). No claim can take such a job (every
-- branch of django_jobs_claim requires expires_at > now()), so this never races a start. Says
-- whether each job has children or dependents, for the cascade (workflows.expire_due).
-- Index: job_expiry_idx (pending jobs with a deadline only: empty without deadlines).
WITH due AS (
    SELECT j.id FROM django_jobs_job j
    WHERE j.state = 'pending' AND j.expires_at IS NOT NULL AND j.expires_at <= now()
    ORDER BY j.expires_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE django_jobs_job j
SET state = 'cancelled', cancel_requested = true, finished_at = now(),
    error = 'expired: not started by its deadline, '
            || to_char(j.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
FROM due
WHERE j.id = due.id AND j.state = 'pending'
RETURNING j.id, j.state,
          (EXISTS (SELECT 1 FROM django_jobs_job c WHERE c.parent_id = j.id)
           OR EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = j.id))
          AS linked
