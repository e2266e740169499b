-- Dependencies, child jobs and cancellation cascades (workflows.py): what follows from a job's
-- end, each step a short statement that locks a small batch of rows (batch), SKIP LOCKED, and
-- says how many it skipped, for the caller to come back for them.

-- name: promote
-- transition: promote
-- Dependents of one job, a page at a time (keyset on job_id): those waiting are locked, SKIP
-- LOCKED, and promoted if their every dependency is done. Returns the page's last key, how many
-- were promoted, and how many were skipped (locked by another transaction).
-- Index: dependency_depends_on_idx (depends_on_id, job_id); the primary key; dependency_unique
-- (job_id, ...) for the other dependencies of each.
WITH page AS (
    SELECT d.job_id FROM django_jobs_dependency d
    WHERE d.depends_on_id = %(job_id)s AND d.job_id > %(after)s
    ORDER BY d.job_id LIMIT %(batch)s
), candidates AS (
    -- One primary-key lookup per row of the page, whatever the statistics say: a hash join
    -- with every waiting job would make each page cost as much as the whole cascade.
    SELECT w.id FROM page CROSS JOIN LATERAL (
        SELECT id FROM django_jobs_job w
        WHERE w.id = page.job_id AND w.state = 'waiting' AND w.attempt = 0 OFFSET 0
    ) w
), locked AS (
    SELECT w.id FROM django_jobs_job w WHERE w.id IN (SELECT id FROM candidates)
    FOR NO KEY UPDATE SKIP LOCKED
), promoted AS (
    UPDATE django_jobs_job w SET state = 'pending', run_after = GREATEST(w.run_after, now())
    FROM locked
    WHERE w.id = locked.id AND w.state = 'waiting' AND w.attempt = 0
      AND NOT EXISTS (
          SELECT 1 FROM django_jobs_dependency d2
          JOIN django_jobs_job dj ON dj.id = d2.depends_on_id
          WHERE d2.job_id = w.id AND dj.state <> 'done'
      )
    RETURNING w.id, (CASE WHEN w.run_after <= now()
                          THEN pg_notify('django_jobs', w.queue) END) IS NULL
)
SELECT (SELECT max(job_id) FROM page) AS last, (SELECT count(*) FROM promoted) AS promoted,
       (SELECT count(*) FROM candidates) - (SELECT count(*) FROM locked) AS skipped

-- name: cancel_dependents
-- transition: cancel dependents
-- Waiting or pending dependents of one job, a page at a time, locked SKIP LOCKED and cancelled
-- with a reason that names the upstream job where the failure started. The first row has the
-- page's last key and the number skipped; then one row per job cancelled, with its parent.
-- Index: dependency_depends_on_idx; the primary key.
WITH page AS (
    SELECT d.job_id FROM django_jobs_dependency d
    WHERE d.depends_on_id = %(job_id)s AND d.job_id > %(after)s
    ORDER BY d.job_id LIMIT %(batch)s
), candidates AS (
    SELECT w.id FROM page CROSS JOIN LATERAL (
        SELECT id FROM django_jobs_job w
        WHERE w.id = page.job_id AND w.state IN ('waiting', 'pending') OFFSET 0
    ) w
), locked AS (
    SELECT w.id FROM django_jobs_job w WHERE w.id IN (SELECT id FROM candidates)
    FOR NO KEY UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE django_jobs_job w SET state = 'cancelled', finished_at = now(), error = %(reason)s
    FROM locked
    WHERE w.id = locked.id AND w.state IN ('waiting', 'pending')
    RETURNING w.id, w.parent_id
)
SELECT (SELECT max(job_id) FROM page) AS last,
       (SELECT count(*) FROM candidates) - (SELECT count(*) FROM locked) AS skipped,
       NULL::bigint AS changed_id, NULL::bigint AS parent_id
UNION ALL
SELECT NULL, NULL, id, parent_id FROM cancelled

-- name: cancel_children
-- transition: cancel
-- Unfinished children of one job, a page at a time, locked SKIP LOCKED and cancelled as
-- cancel_many (control.sql) cancels: pending and waiting ones at once, running ones asked to
-- stop (their workers stop them within a heartbeat interval). With an attempt, only the
-- children that attempt spawned (and, if final, those whose attempt was not recorded). Rows as
-- in cancel_dependents. Index: job_parent_idx.
WITH page AS (
    SELECT c.id FROM django_jobs_job c
    WHERE c.parent_id = %(job_id)s AND c.id > %(after)s
      AND c.state IN ('waiting', 'pending', 'running')
      AND (%(attempt)s::int IS NULL OR c.parent_attempt = %(attempt)s
           OR (c.parent_attempt IS NULL AND %(final)s))
    ORDER BY c.id LIMIT %(batch)s
), locked AS (
    SELECT c.id FROM django_jobs_job c WHERE c.id IN (SELECT id FROM page)
    FOR NO KEY UPDATE SKIP LOCKED
), changed AS (
    UPDATE django_jobs_job j
    SET state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
        cancel_requested = true,
        finished_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        error = CASE WHEN j.state = 'running' THEN j.error ELSE %(reason)s END
    FROM locked
    WHERE j.id = locked.id AND j.state IN ('waiting', 'pending', 'running')
    RETURNING j.id, j.parent_id
)
SELECT (SELECT max(id) FROM page) AS last,
       (SELECT count(*) FROM page) - (SELECT count(*) FROM locked) AS skipped,
       NULL::bigint AS changed_id, NULL::bigint AS parent_id
UNION ALL
SELECT NULL, NULL, id, parent_id FROM changed

-- name: finalize_parent
-- transition: finalize parent
-- Finalize a parent that is waiting for children, once none is active. Only the children of
-- its final attempt count (parent_attempt; NULL for children made before it was recorded): an
-- earlier attempt's children were cancelled when that attempt failed. The aggregate over the
-- children runs only if the parent qualifies. Index: job_parent_idx.
WITH ready AS (
    SELECT p.id, p.attempt FROM django_jobs_job p
    WHERE p.id = %(job_id)s AND p.state = 'waiting' AND p.attempt > 0
      AND NOT EXISTS (
          SELECT 1 FROM django_jobs_job c
          WHERE c.parent_id = p.id AND c.state IN ('waiting', 'pending', 'running')
            AND (c.parent_attempt IS NULL OR c.parent_attempt = p.attempt)
      )
), kids AS (
    SELECT min(c.id) FILTER (WHERE c.state = 'error') AS first_error,
           min(c.id) FILTER (WHERE c.state = 'cancelled') AS first_cancelled
    FROM django_jobs_job c JOIN ready r ON c.parent_id = r.id
    WHERE c.parent_attempt IS NULL OR c.parent_attempt = r.attempt
)
UPDATE django_jobs_job p
SET state = CASE WHEN k.first_error IS NOT NULL THEN 'error'
                 WHEN k.first_cancelled IS NOT NULL THEN 'cancelled'
                 ELSE 'done' END,
    finished_at = now(),
    error = CASE WHEN k.first_error IS NOT NULL
                 THEN 'child job #' || k.first_error || ' ended in error'
                 WHEN k.first_cancelled IS NOT NULL
                 THEN 'child job #' || k.first_cancelled || ' was cancelled'
                 ELSE p.error END
FROM ready, kids k
WHERE p.id = ready.id AND p.state = 'waiting'
RETURNING p.state

-- name: settle_new
-- transition: settle new dependent
-- New waiting dependents, checked again once the transaction that enqueued them has committed
-- (see enqueue.py): promoted if every dependency is done by now, cancelled if one ended in
-- error or was cancelled. FOR SHARE on the dependencies waits for a finish that is in flight
-- (it holds its row FOR NO KEY UPDATE) and sees its outcome; the lock lasts this statement
-- only. A bounded batch of the new jobs, locked SKIP LOCKED; the ids of those that were skipped
-- come back, for another try.
-- Index: the primary key; dependency_unique (job_id, depends_on_id) for the links.
WITH upstream AS (
    SELECT dj.id, dj.state, dj.task FROM django_jobs_job dj
    WHERE dj.id IN (
        SELECT d.depends_on_id FROM django_jobs_dependency d WHERE d.job_id = ANY(%(ids)s)
    )
    FOR SHARE OF dj
), targets AS (
    SELECT w.id FROM django_jobs_job w
    WHERE w.id = ANY(%(ids)s) AND w.state = 'waiting' AND w.attempt = 0
    FOR NO KEY UPDATE OF w SKIP LOCKED
), verdicts AS (
    SELECT t.id, bool_and(u.state = 'done') AS all_done,
           min(u.id) FILTER (WHERE u.state IN ('error', 'cancelled')) AS failed
    FROM targets t
    JOIN django_jobs_dependency d ON d.job_id = t.id
    JOIN upstream u ON u.id = d.depends_on_id
    GROUP BY t.id
), changed AS (
    UPDATE django_jobs_job w
    SET state = CASE WHEN v.failed IS NULL THEN 'pending' ELSE 'cancelled' END,
        run_after = CASE WHEN v.failed IS NULL THEN GREATEST(w.run_after, now())
                         ELSE w.run_after END,
        finished_at = CASE WHEN v.failed IS NULL THEN NULL ELSE now() END,
        error = CASE WHEN v.failed IS NULL THEN w.error
                     ELSE 'cancelled: upstream job #' || u.id || ' (' || u.task || ') ended '
                          || u.state END
    FROM verdicts v LEFT JOIN upstream u ON u.id = v.failed
    WHERE w.id = v.id AND (v.all_done OR v.failed IS NOT NULL)
    RETURNING w.id, w.state,
              (CASE WHEN w.state = 'pending' AND w.run_after <= now()
                    THEN pg_notify('django_jobs', w.queue) END) IS NULL
)
SELECT id, state FROM changed
UNION ALL
SELECT w.id, 'skipped' FROM django_jobs_job w
WHERE w.id = ANY(%(ids)s) AND w.state = 'waiting' AND w.attempt = 0
  AND w.id NOT IN (SELECT id FROM targets)

-- name: job_to_settle
-- What settling a job starts from. Index: the primary key.
SELECT state, parent_id, attempt, task FROM django_jobs_job WHERE id = %(job_id)s

-- name: dependencies_of
-- The jobs one job depends on. Index: dependency_unique (job_id, ...).
SELECT depends_on_id FROM django_jobs_dependency WHERE job_id = %(job_id)s

-- name: unsettled_parents
-- Parents a crash may have left unsettled: waiting for children (attempt > 0) with none of
-- their final attempt's children still active. Index: job_waiting_parent_idx (partial on
-- waiting parents only, as few as the workflows in flight), then job_parent_idx for each one's
-- children.
SELECT w.id FROM django_jobs_job w
WHERE w.state = 'waiting' AND w.attempt > 0
  AND NOT EXISTS (
    SELECT 1 FROM django_jobs_job c
    WHERE c.parent_id = w.id AND c.state IN ('waiting', 'pending', 'running')
      AND (c.parent_attempt IS NULL OR c.parent_attempt = w.attempt))
ORDER BY w.id
LIMIT %(limit)s

-- name: unsettled_dependents
-- A page of the jobs waiting for dependencies (attempt 0), in id order after a key and up to
-- another (NULL: no bound), each with whether a crash may have left it unsettled: nothing left
-- to wait for (every dependency done, or it has none), or a dependency that ended in error or
-- was cancelled. The reaper reads one page per pass and goes on from there the next pass
-- (workflows.repair), so a pass costs the page, not the table's backlog of waiting jobs.
-- Index: job_waiting_dependent_idx (id, partial on waiting with attempt 0); for each job of the
-- page, dependency_unique (job_id, ...) and the primary key of its dependencies, one lookup each.
SELECT w.id, coalesce(v.all_done, true) OR coalesce(v.failed, false) AS unsettled
FROM (
    SELECT w.id FROM django_jobs_job w
    WHERE w.state = 'waiting' AND w.attempt = 0 AND w.id > %(after)s
      AND (%(until)s::bigint IS NULL OR w.id <= %(until)s::bigint)
    ORDER BY w.id
    LIMIT %(limit)s
) w
CROSS JOIN LATERAL (
    SELECT bool_and(dj.state = 'done') AS all_done,
           bool_or(dj.state IN ('error', 'cancelled')) AS failed
    FROM django_jobs_dependency d JOIN django_jobs_job dj ON dj.id = d.depends_on_id
    WHERE d.job_id = w.id
) v
ORDER BY w.id

-- name: stray_children
-- Children that a crash may have left running after their parent's attempt failed: active
-- children of an attempt that is over (the parent has ended for good, or is on a later
-- attempt). Index: job_active_child_idx (partial: active children of a recorded attempt only, so
-- a pass does not walk the finished children of every workflow), then the parents' primary key.
SELECT DISTINCT p.id AS parent_id, p.attempt, p.state FROM django_jobs_job p
JOIN django_jobs_job c ON c.parent_id = p.id
WHERE c.state IN ('waiting', 'pending') AND c.parent_attempt IS NOT NULL
  AND (p.state IN ('error', 'cancelled')
       OR c.parent_attempt < p.attempt
       OR (p.state = 'pending' AND c.parent_attempt = p.attempt))
ORDER BY p.id
LIMIT %(limit)s
