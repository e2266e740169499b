-- Long jobs that keep their work (store/steps.py): a job's recorded steps and its cursors, read
-- when a run resumes and written, fenced on the run's lease, as it goes.

-- name: record_step
-- A completed step of a running attempt: its JSON result, recorded once per job and name. Fenced
-- on the whole lease: the job row is read FOR SHARE, which waits for a reap, a finish or a
-- heartbeat of the row in progress and then re-reads it, so a run that lost its lease records
-- nothing, even one that lost it a moment ago. The children the step spawned (children, their
-- ids) are made the job's own rather than this attempt's (parent_attempt NULL): they are not
-- cancelled when this attempt fails, since a later attempt replays past the step and will not
-- spawn them again, and they count for whichever attempt ends the job. ON CONFLICT: the name was
-- recorded already (by an attempt that lost its lease just after recording it, say); the first
-- result stands, and the caller reads it. result: the result as recorded, which is what every
-- later attempt reads back (jsonb writes a number without its exponent, 1e16 as an int, and
-- orders an object's keys), for the recording attempt to return too.
-- Index: the job table's primary key; step_job_name_unique; job_parent_idx for the children.
WITH owner AS (
    SELECT id FROM django_jobs_job
    WHERE id = %(job_id)s AND state = 'running' AND attempt = %(attempt)s
      AND worker_id = %(worker_id)s AND lease = %(lease)s::uuid
    FOR SHARE
), recorded AS (
    INSERT INTO django_jobs_step (job_id, name, attempt, lease, result, result_bytes,
                                  recorded_at, duration)
    SELECT id, %(name)s::text, %(attempt)s, %(lease)s::uuid, %(result)s::jsonb,
           %(result_bytes)s, now(), %(duration)s::float8
    FROM owner
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING job_id, result::text AS result
), adopted AS (
    UPDATE django_jobs_job c SET parent_attempt = NULL
    FROM recorded r
    WHERE c.parent_id = r.job_id AND c.id = ANY(%(children)s::bigint[])
      AND c.parent_attempt = %(attempt)s
    RETURNING c.id
)
SELECT EXISTS (SELECT 1 FROM owner) AS owner, EXISTS (SELECT 1 FROM recorded) AS recorded,
       (SELECT count(*) FROM adopted)::int AS adopted, (SELECT result FROM recorded) AS result

-- name: step_result
-- The recorded result of one step of a job, as JSON text, when record_step found the name
-- recorded already. Index: step_job_name_unique.
SELECT result::text AS result FROM django_jobs_step WHERE job_id = %(job_id)s AND name = %(name)s

-- name: checkpoint
-- What a run resumes from: the results of the job's recorded steps, by name, and its cursors'
-- values, by name, as JSON text (NULL: none). Read once per run, by a run that uses a step or a
-- cursor, never by one that does not; django_jobs_checkpoint (functions/) reads them.
-- Index: those of django_jobs_checkpoint.
SELECT steps, cursors FROM django_jobs_checkpoint(%(job_id)s)

-- name: owns_lease
-- Whether the run of this lease still owns its job: the job is running this very claim
-- (context.is_owner()). Index: the job table's primary key.
SELECT EXISTS (
    SELECT 1 FROM django_jobs_job
    WHERE id = %(job_id)s AND state = 'running' AND attempt = %(attempt)s
      AND worker_id = %(worker_id)s AND lease = %(lease)s::uuid
) AS owner

-- name: job_steps
-- The steps of a job, in the order they were recorded, for its page in the admin and the HTTP
-- API's job view (the results' sizes, not the results). Index: step_job_name_unique.
SELECT name, attempt, recorded_at, duration, result_bytes
FROM django_jobs_step WHERE job_id = %(job_id)s ORDER BY id

-- name: latest_steps
-- The last steps a job recorded, newest first, at most limit of them, each with the number of
-- steps the job has in all (total): for its page in the admin, which lists the latest and says
-- how many it leaves out (the results' sizes, not the results). count(*) OVER () is taken over
-- all the job's steps, before the LIMIT, so the job's steps are read through its index whatever
-- their number: never a backward walk of the step table's primary key until limit of them turn
-- up, which a plain ORDER BY id DESC LIMIT could be planned as. Index: step_job_name_unique.
SELECT name, attempt, recorded_at, duration, result_bytes, count(*) OVER () AS total
FROM django_jobs_step WHERE job_id = %(job_id)s ORDER BY id DESC LIMIT %(limit)s

-- name: clear_checkpoint
-- An operator's "retry from the start": forget the recorded steps and the cursors of the jobs
-- that the retry before it, in the same transaction, made pending again (retry_many's changed
-- ids). Their rows are locked by that retry until the transaction commits, so no worker claims
-- one of them before its steps are gone. The lease token is drawn anew, though nobody holds the
-- job: the run that last held it may still have a cursor write on its way (record_live is
-- fenced on the token and attempt, not the state, so that a last write queued before a finish
-- may land after it), and it must not bring back a cursor the operator asked to forget.
-- Index: the job table's primary key; step_job_name_unique.
WITH cleared AS (
    UPDATE django_jobs_job SET cursors = NULL, lease = gen_random_uuid()
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
    RETURNING id
)
DELETE FROM django_jobs_step s USING cleared WHERE s.job_id = cleared.id
