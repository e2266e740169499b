"""Leases that a server crash cannot repeat: a random token per claim.

A claim draws a new token with ``gen_random_uuid()`` and stores it on the job and on its attempt
row. Every later write of that run (heartbeat, finish, release, reap) is fenced on it. An attempt
number alone could be handed out twice: a crash that lost a claim would roll the number back, and
the next claim would repeat it. The columns are nullable and added without a default, so that
adding them rewrites no table; rows claimed before this migration keep a NULL lease, which the
fences match as NULL.

The claim and finish functions change shape (the claim returns the token, the finish takes it),
so they are dropped and made again. Workers that run code from before this migration fail their
claims and finishes until they are replaced: restart the workers after migrating. The bodies are
the statements of ``django_jobs/transitions.py`` as they were when this migration was written;
tests check that the database's functions match them.
"""

import importlib

from django.db import migrations, models

# Going back restores the functions as migration 0005 made them.
_PREVIOUS = importlib.import_module("django_jobs.migrations.0005_hot_path_functions")

CLAIM_BODY = """#variable_conflict use_column
BEGIN
    IF p_queues IS NULL OR cardinality(p_queues) = 0 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now()
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
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
    ELSIF cardinality(p_queues) = 1 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = p_queues[1]
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
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
        WHERE state = 'pending' AND run_after <= now() AND queue = ANY(p_queues)
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
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
END
"""

FINISH_BODY = """#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH target AS (
    SELECT id, attempt,
           CASE
               WHEN p_outcome = 'done' THEN
                   CASE WHEN EXISTS (
                       SELECT 1 FROM django_jobs_job c
                       WHERE c.parent_id = j.id AND c.state IN ('waiting', 'pending', 'running')
                   ) THEN 'waiting' ELSE 'done' END
               WHEN cancel_requested OR p_outcome = 'cancelled' THEN 'cancelled'
               WHEN p_retryable AND attempt < max_attempts THEN 'pending'
               ELSE 'error'
           END AS new_state
    FROM django_jobs_job j
    WHERE id = p_job_id AND state = 'running' AND attempt = p_attempt
      AND worker_id = p_worker_id AND lease IS NOT DISTINCT FROM p_lease::uuid
    FOR UPDATE
), job AS (
    UPDATE django_jobs_job j
    SET state = t.new_state,
        finished_at = CASE WHEN t.new_state IN ('pending', 'waiting') THEN NULL ELSE now() END,
        run_after = CASE WHEN t.new_state = 'pending'
                         THEN now() + make_interval(secs => p_retry_delay)
                         ELSE j.run_after END,
        worker_id = CASE WHEN t.new_state = 'pending' THEN NULL ELSE j.worker_id END,
        result = p_result::jsonb,
        error = p_error
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, j.state, j.parent_id
), closed AS (
    UPDATE django_jobs_attempt a
    SET finished_at = now(), outcome = p_outcome, error = p_error, traceback = p_traceback
    FROM target t
    WHERE a.job_id = t.id AND a.number = t.attempt AND a.worker_id = p_worker_id
      AND a.lease IS NOT DISTINCT FROM p_lease::uuid AND a.outcome = 'running'
)
SELECT state, parent_id,
       EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = job.id)
FROM job
;
END
"""

CREATE_CLAIM = f"""
CREATE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, lease uuid, attempt_id bigint
)
LANGUAGE plpgsql AS $body${CLAIM_BODY}$body$
"""

CREATE_FINISH = f"""
CREATE FUNCTION django_jobs_finish(
    p_job_id bigint, p_attempt integer, p_worker_id text, p_lease uuid, p_outcome text,
    p_result text, p_error text, p_traceback text, p_retryable boolean, p_retry_delay float8
)
RETURNS TABLE (state varchar, parent_id bigint, has_dependents boolean)
LANGUAGE plpgsql AS $body${FINISH_BODY}$body$
"""

DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[])"
DROP_FINISH = (
    "DROP FUNCTION IF EXISTS django_jobs_finish(bigint, integer, text, text, text, text, text,"
    " boolean, float8)"
)
DROP_NEW_FINISH = (
    "DROP FUNCTION IF EXISTS django_jobs_finish(bigint, integer, text, uuid, text, text, text,"
    " text, boolean, float8)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0006_partial_parent_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="lease",
            field=models.UUIDField(
                blank=True,
                editable=False,
                help_text="Random token of the latest claim; every later write of that run is "
                "fenced on it. A server crash cannot roll it back into a value that is handed out "
                "again.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="attempt",
            name="lease",
            field=models.UUIDField(
                blank=True, editable=False, help_text="The claim's token.", null=True
            ),
        ),
        migrations.RunSQL([DROP_CLAIM, CREATE_CLAIM], [DROP_CLAIM, _PREVIOUS.CREATE_CLAIM]),
        migrations.RunSQL([DROP_FINISH, CREATE_FINISH], [DROP_NEW_FINISH, _PREVIOUS.CREATE_FINISH]),
    ]
