-- Periodic jobs (schedules/declarations.py, schedules/ticks.py). A scheduler asks next_due between ticks (one small
-- statement on schedule_due_idx); when a schedule is due it handles it in one short
-- transaction: lock_due_schedule, insert_tick (the unique constraint schedule_tick_once decides
-- that a tick enqueues once, however many schedulers run), insert_job of enqueue.sql (the same
-- statement as Task.enqueue), then record_tick, which advances next_run_at in the same
-- transaction, so that other schedulers find nothing due. The clock is always the database's.

-- name: next_due
-- Seconds until the earliest active, unpaused schedule of a registered task is due (negative:
-- overdue), with the clock; NULL seconds when there is none. Index: schedule_due_idx.
SELECT EXTRACT(EPOCH FROM min(next_run_at) - now())::float8, now()
FROM django_jobs_schedule
WHERE NOT paused AND missing_from_code_since IS NULL AND next_run_at IS NOT NULL
  AND task = ANY(%(tasks)s)

-- name: lock_due_schedule
-- The earliest due schedule that no other scheduler is handling, locked for this transaction
-- (milliseconds). A row another scheduler has just advanced is read with its new next_run_at
-- and no longer qualifies. Index: schedule_due_idx.
SELECT id, name, task, cron, timezone, args, kwargs, queue, priority, catch_up, overlap,
       when_queue_paused, next_run_at, paused, now() AS now
FROM django_jobs_schedule
WHERE NOT paused AND missing_from_code_since IS NULL AND next_run_at <= now()
  AND task = ANY(%(tasks)s)
ORDER BY next_run_at
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: lock_schedule
-- One schedule, locked (run now, pause, resume, an edit), with the clock.
SELECT id, name, task, cron, timezone, args, kwargs, queue, priority, catch_up, overlap,
       when_queue_paused, next_run_at, paused, now() AS now
FROM django_jobs_schedule WHERE id = %(id)s
FOR UPDATE

-- name: insert_tick
-- Claim a tick: nothing is returned if a scheduler has handled it already.
INSERT INTO django_jobs_schedule_tick (schedule_id, fire_at, outcome, created_at)
VALUES (%(id)s, %(fire_at)s, %(outcome)s, now())
ON CONFLICT (schedule_id, fire_at) DO NOTHING
RETURNING id

-- name: record_tick
-- The tick's job and outcome (tick_id NULL: no tick was run), and the schedule advanced
-- (last_outcome NULL: kept, for a tick another scheduler handled).
WITH tick AS (
    UPDATE django_jobs_schedule_tick SET job_id = %(job_id)s, outcome = %(outcome)s
    WHERE id = %(tick_id)s
)
UPDATE django_jobs_schedule
SET next_run_at = %(next_run_at)s,
    last_run_at = COALESCE(%(fire_at)s, last_run_at),
    last_job_id = COALESCE(%(job_id)s, last_job_id),
    last_outcome = COALESCE(left(%(last_outcome)s, 200), last_outcome),
    updated_at = now()
WHERE id = %(id)s

-- name: set_next_run
-- After an edit, a resume or a sync: the next fire time; last_outcome kept unless given.
UPDATE django_jobs_schedule
SET next_run_at = %(next_run_at)s, last_outcome = COALESCE(%(last_outcome)s, last_outcome),
    updated_at = now()
WHERE id = %(id)s

-- name: resume_schedule
-- A paused schedule fires again from %(next_run_at)s, its next tick after now (read under the
-- row's lock, lock_schedule, in the same transaction): a scheduler sees it paused, or resumed
-- with a tick still to come, never resumed with one that passed while it was paused. Every
-- other field stays. A schedule that is not paused is left as it is, its due tick with it.
UPDATE django_jobs_schedule
SET paused = false, paused_at = NULL, paused_by = '', next_run_at = %(next_run_at)s,
    updated_at = now()
WHERE id = %(id)s AND paused

-- name: edit_schedule
-- An operator's edit in the admin, under the row's lock (lock_schedule): only the fields
-- flagged set_<field> change, and next_run_at only when given (the cron expression or time
-- zone changed); a pause, a run or a due tick written since the form was read stays.
UPDATE django_jobs_schedule
SET name = CASE WHEN %(set_name)s THEN %(name)s ELSE name END,
    task = CASE WHEN %(set_task)s THEN %(task)s ELSE task END,
    cron = CASE WHEN %(set_cron)s THEN %(cron)s ELSE cron END,
    timezone = CASE WHEN %(set_timezone)s THEN %(timezone)s ELSE timezone END,
    args = CASE WHEN %(set_args)s THEN %(args)s::jsonb ELSE args END,
    kwargs = CASE WHEN %(set_kwargs)s THEN %(kwargs)s::jsonb ELSE kwargs END,
    queue = CASE WHEN %(set_queue)s THEN %(queue)s ELSE queue END,
    priority = CASE WHEN %(set_priority)s THEN %(priority)s::int ELSE priority END,
    catch_up = CASE WHEN %(set_catch_up)s THEN %(catch_up)s ELSE catch_up END,
    overlap = CASE WHEN %(set_overlap)s THEN %(overlap)s ELSE overlap END,
    when_queue_paused = CASE WHEN %(set_when_queue_paused)s THEN %(when_queue_paused)s
                             ELSE when_queue_paused END,
    next_run_at = COALESCE(%(next_run_at)s, next_run_at),
    updated_at = now()
WHERE id = %(id)s

-- name: set_paused
UPDATE django_jobs_schedule
SET paused = %(paused)s, paused_at = CASE WHEN %(paused)s THEN now() END,
    paused_by = %(by)s, updated_at = now()
WHERE id = %(id)s
RETURNING paused_at

-- name: sync_lock
-- Two schedulers starting together sync one after the other (for this transaction only).
SELECT pg_advisory_xact_lock(hashtext('django_jobs_schedule_sync')) AS locked, now() AS now

-- name: read_schedules
SELECT id, name, source, task, cron, timezone, args, kwargs, queue, priority, catch_up,
       overlap, when_queue_paused, missing_from_code_since
FROM django_jobs_schedule ORDER BY name

-- name: insert_schedule
INSERT INTO django_jobs_schedule (name, task, cron, timezone, args, kwargs, queue, priority,
    catch_up, overlap, when_queue_paused, paused, paused_by, source, next_run_at, last_outcome,
    created_at, updated_at)
VALUES (%(name)s, %(task)s, %(cron)s, %(timezone)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(queue)s,
    %(priority)s, %(catch_up)s, %(overlap)s, %(when_queue_paused)s, false, '', 'code',
    %(next_run_at)s, '', now(), now())
ON CONFLICT (name) DO NOTHING

-- name: update_schedule
-- Code wins for the fields code declares; pausing and the run history stay.
UPDATE django_jobs_schedule
SET task = %(task)s, cron = %(cron)s, timezone = %(timezone)s, args = %(args)s::jsonb,
    kwargs = %(kwargs)s::jsonb, queue = %(queue)s, priority = %(priority)s, catch_up = %(catch_up)s,
    overlap = %(overlap)s, when_queue_paused = %(when_queue_paused)s,
    missing_from_code_since = NULL,
    -- A tick due and not yet fired still fires (the new times follow it), unless the
    -- schedule was removed from code: the times it missed then are never run.
    next_run_at = CASE
        WHEN missing_from_code_since IS NULL AND next_run_at <= now() THEN next_run_at
        ELSE COALESCE(%(next_run_at)s, next_run_at)
    END,
    updated_at = now()
WHERE name = %(name)s AND source = 'code'

-- name: mark_missing
-- Code schedules no longer declared stop firing (the admin shows them).
UPDATE django_jobs_schedule SET missing_from_code_since = now(), updated_at = now()
WHERE source = 'code' AND missing_from_code_since IS NULL AND name = ANY(%(names)s)
