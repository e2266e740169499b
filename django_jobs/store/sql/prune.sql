-- Retention (prune.py): finished jobs deleted in bounded batches, with their attempts and
-- dependency rows. A finished job is kept while an unfinished job depends on it or descends
-- from it; its finished children that stay lose their parent_id (as on_delete=SET_NULL would).
--
-- A batch: the next batch_size finished jobs in (finished_at, id) order, resuming after the last
-- batch's (finished_at, id), so kept jobs are not read again (job_finished_idx, partial on the
-- finished states); the ones to keep, found through job_parent_idx for descendants and
-- dependency_depends_on_idx and the job primary key for unfinished dependents. Deleting: the
-- jobs are locked FOR UPDATE SKIP LOCKED, their children that stay likewise, and a job whose
-- children cannot all be locked now is left for another try; then the attempts and dependency
-- rows of the rest go (attempt_job_number_idx, dependency_unique and
-- dependency_depends_on_idx), children that stay lose their parent_id (job_parent_idx), and
-- the jobs go, all in the same statement. The descendants' walk keeps each level a lookup per
-- job found so far (OFFSET 0); as a plain join, the planner (which cannot know how deep the
-- trees go) may scan the whole parent_id index per level.

-- name: prune_cutoff
-- One cutoff from the database's clock for the whole run.
SELECT now() - %(age)s::interval AS cutoff

-- name: prune_batch
-- Delete a batch: lock the candidates that are not kept (re-checking their state, since an
-- operator may have retried one meanwhile; SKIP LOCKED passes over rows someone is writing),
-- and delete them as above.
WITH RECURSIVE batch AS (
    SELECT id, finished_at FROM django_jobs_job
    WHERE state IN ('done', 'error', 'cancelled') AND state = ANY(%(states)s)
      AND finished_at < %(cutoff)s
      AND (finished_at, id) > (%(after_at)s::timestamptz, %(after_id)s)
    ORDER BY finished_at, id
    LIMIT %(batch_size)s
), descendants (root, id, state) AS (
    SELECT b.id, c.id, c.state FROM batch b JOIN django_jobs_job c ON c.parent_id = b.id
    UNION
    SELECT d.root, c.id, c.state FROM descendants d
    CROSS JOIN LATERAL (SELECT id, state FROM django_jobs_job WHERE parent_id = d.id OFFSET 0) c
), kept AS (
    SELECT root AS id FROM descendants WHERE state IN ('waiting', 'pending', 'running')
    UNION
    SELECT b.id FROM batch b
    JOIN django_jobs_dependency dep ON dep.depends_on_id = b.id
    JOIN django_jobs_job u ON u.id = dep.job_id
    WHERE u.state IN ('waiting', 'pending', 'running')
), last AS (
    SELECT finished_at, id FROM batch ORDER BY finished_at DESC, id DESC LIMIT 1
), locked AS (
    SELECT j.id FROM batch b JOIN django_jobs_job j ON j.id = b.id
    WHERE b.id NOT IN (SELECT id FROM kept)
      AND j.state IN ('done', 'error', 'cancelled') AND j.state = ANY(%(states)s)
      AND j.finished_at < %(cutoff)s
    FOR UPDATE OF j SKIP LOCKED
), children AS (
    SELECT c.id, c.parent_id FROM django_jobs_job c
    WHERE c.parent_id IN (SELECT id FROM locked) AND c.id NOT IN (SELECT id FROM locked)
), held_children AS (
    SELECT c.id FROM django_jobs_job c WHERE c.id IN (SELECT id FROM children)
    FOR NO KEY UPDATE OF c SKIP LOCKED
), doomed AS (
    SELECT l.id FROM locked l
    WHERE NOT EXISTS (
        SELECT 1 FROM children c
        WHERE c.parent_id = l.id AND c.id NOT IN (SELECT id FROM held_children))
), attempts AS (
    DELETE FROM django_jobs_attempt a USING doomed WHERE a.job_id = doomed.id RETURNING 1
), own_links AS (
    DELETE FROM django_jobs_dependency d USING doomed WHERE d.job_id = doomed.id RETURNING 1
), links_to AS (
    DELETE FROM django_jobs_dependency d USING doomed
    WHERE d.depends_on_id = doomed.id AND d.job_id NOT IN (SELECT id FROM doomed) RETURNING 1
), orphans AS (
    UPDATE django_jobs_job c SET parent_id = NULL FROM doomed
    WHERE c.parent_id = doomed.id AND c.id NOT IN (SELECT id FROM doomed) RETURNING 1
), jobs AS (
    DELETE FROM django_jobs_job j USING doomed WHERE j.id = doomed.id RETURNING j.id
)
SELECT (SELECT count(*) FROM batch) AS scanned, (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM attempts) AS attempts,
       (SELECT count(*) FROM own_links) + (SELECT count(*) FROM links_to) AS dependencies,
       (SELECT count(*) FROM orphans) AS orphans,
       (SELECT finished_at FROM last) AS last_at, (SELECT id FROM last) AS last_id

-- name: prune_batch_count
-- The same batch, counted instead of deleted (--dry-run). A dependency row between a job of
-- this batch and a job pruned in another batch is counted with its dependent job, once. (The
-- count misses a row whose dependent is kept in another batch: rare, and only in a dry run.)
WITH RECURSIVE batch AS (
    SELECT id, finished_at FROM django_jobs_job
    WHERE state IN ('done', 'error', 'cancelled') AND state = ANY(%(states)s)
      AND finished_at < %(cutoff)s
      AND (finished_at, id) > (%(after_at)s::timestamptz, %(after_id)s)
    ORDER BY finished_at, id
    LIMIT %(batch_size)s
), descendants (root, id, state) AS (
    SELECT b.id, c.id, c.state FROM batch b JOIN django_jobs_job c ON c.parent_id = b.id
    UNION
    SELECT d.root, c.id, c.state FROM descendants d
    CROSS JOIN LATERAL (SELECT id, state FROM django_jobs_job WHERE parent_id = d.id OFFSET 0) c
), kept AS (
    SELECT root AS id FROM descendants WHERE state IN ('waiting', 'pending', 'running')
    UNION
    SELECT b.id FROM batch b
    JOIN django_jobs_dependency dep ON dep.depends_on_id = b.id
    JOIN django_jobs_job u ON u.id = dep.job_id
    WHERE u.state IN ('waiting', 'pending', 'running')
), last AS (
    SELECT finished_at, id FROM batch ORDER BY finished_at DESC, id DESC LIMIT 1
), doomed AS (
    SELECT id FROM batch WHERE id NOT IN (SELECT id FROM kept)
)
SELECT (SELECT count(*) FROM batch) AS scanned, (SELECT count(*) FROM doomed) AS jobs,
       (SELECT count(*) FROM django_jobs_attempt a WHERE a.job_id IN (SELECT id FROM doomed))
           AS attempts,
       (SELECT count(*) FROM django_jobs_dependency d WHERE d.job_id IN (SELECT id FROM doomed))
       + (SELECT count(*) FROM django_jobs_dependency d JOIN django_jobs_job u ON u.id = d.job_id
          WHERE d.depends_on_id IN (SELECT id FROM doomed)
            AND d.job_id NOT IN (SELECT id FROM doomed)
            AND (u.id IN (SELECT id FROM kept)
                 OR NOT (u.state IN ('done', 'error', 'cancelled') AND u.state = ANY(%(states)s)
                         AND u.finished_at < %(cutoff)s))) AS dependencies,
       (SELECT count(*) FROM django_jobs_job c
        WHERE c.parent_id IN (SELECT id FROM doomed) AND c.id NOT IN (SELECT id FROM doomed))
           AS orphans,
       (SELECT finished_at FROM last) AS last_at, (SELECT id FROM last) AS last_id

-- name: delete_finished_jobs
-- Delete the finished jobs among a small batch of ids (the admin's delete), as a batch is
-- deleted. The ids of finished jobs left alone come back as busy.
WITH locked AS (
    SELECT j.id FROM django_jobs_job j
    WHERE j.id = ANY(%(ids)s) AND j.state IN ('done', 'error', 'cancelled')
    FOR UPDATE OF j SKIP LOCKED
), children AS (
    SELECT c.id, c.parent_id FROM django_jobs_job c
    WHERE c.parent_id IN (SELECT id FROM locked) AND c.id NOT IN (SELECT id FROM locked)
), held_children AS (
    SELECT c.id FROM django_jobs_job c WHERE c.id IN (SELECT id FROM children)
    FOR NO KEY UPDATE OF c SKIP LOCKED
), doomed AS (
    SELECT l.id FROM locked l
    WHERE NOT EXISTS (
        SELECT 1 FROM children c
        WHERE c.parent_id = l.id AND c.id NOT IN (SELECT id FROM held_children))
), attempts AS (
    DELETE FROM django_jobs_attempt a USING doomed WHERE a.job_id = doomed.id RETURNING 1
), own_links AS (
    DELETE FROM django_jobs_dependency d USING doomed WHERE d.job_id = doomed.id RETURNING 1
), links_to AS (
    DELETE FROM django_jobs_dependency d USING doomed
    WHERE d.depends_on_id = doomed.id AND d.job_id NOT IN (SELECT id FROM doomed) RETURNING 1
), orphans AS (
    UPDATE django_jobs_job c SET parent_id = NULL FROM doomed
    WHERE c.parent_id = doomed.id AND c.id NOT IN (SELECT id FROM doomed) RETURNING 1
), jobs AS (
    DELETE FROM django_jobs_job j USING doomed WHERE j.id = doomed.id RETURNING j.id
)
SELECT id, 'deleted' AS what FROM jobs
UNION ALL
SELECT j.id, 'busy' FROM django_jobs_job j
WHERE j.id = ANY(%(ids)s) AND j.state IN ('done', 'error', 'cancelled')
  AND j.id NOT IN (SELECT id FROM doomed)

-- name: prune_ticks
-- The record of periodic jobs' ticks older than the cutoff, a batch at a time, in its own
-- short transaction (schedule_tick_created_idx); rows a scheduler is writing are passed over.
WITH batch AS (
    SELECT id FROM django_jobs_schedule_tick WHERE created_at < %(cutoff)s
    ORDER BY created_at LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM django_jobs_schedule_tick t USING batch WHERE t.id = batch.id RETURNING 1
)
SELECT count(*) AS ticks FROM gone

-- name: count_old_ticks
SELECT count(*) AS ticks FROM django_jobs_schedule_tick WHERE created_at < %(cutoff)s
