"""The worker's claim and finish as PL/pgSQL functions.

PostgreSQL plans the statements inside a PL/pgSQL function once per connection and keeps the
plans, so a worker that calls these functions does not pay for planning its two statements on
every job. No statement is prepared on the protocol, so this works through pgbouncer in
transaction-pooling mode. The bodies are the statements of ``django_jobs/transitions.py`` as
they were when this migration was written; tests check that the database's functions match
``transitions.CLAIM_FUNCTION_BODY`` and ``transitions.FINISH_FUNCTION_BODY``, so a change to
those statements comes with a migration that replaces the functions.
"""

from django.db import migrations

CLAIM_BODY = """
#variable_conflict use_column
BEGIN
    IF p_queues IS NULL OR cardinality(p_queues) = 0 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now()
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '' FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    ELSIF cardinality(p_queues) = 1 THEN
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = p_queues[1]
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '' FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    ELSE
        RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND queue = ANY(p_queues)
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AND state = 'pending'
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id
), opened AS (
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, p_worker_id, now(), 'running', '', '' FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
;
    END IF;
END
"""

FINISH_BODY = """
#variable_conflict use_column
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
      AND worker_id = p_worker_id
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
      AND a.outcome = 'running'
)
SELECT state, parent_id,
       EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = job.id)
FROM job
;
END
"""

CREATE_CLAIM = f"""
CREATE OR REPLACE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, attempt_id bigint
)
LANGUAGE plpgsql AS $body${CLAIM_BODY}$body$
"""

CREATE_FINISH = f"""
CREATE OR REPLACE FUNCTION django_jobs_finish(
    p_job_id bigint, p_attempt integer, p_worker_id text, p_outcome text, p_result text,
    p_error text, p_traceback text, p_retryable boolean, p_retry_delay float8
)
RETURNS TABLE (state varchar, parent_id bigint, has_dependents boolean)
LANGUAGE plpgsql AS $body${FINISH_BODY}$body$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0004_admin_indexes_and_dashboard"),
    ]

    operations = [
        migrations.RunSQL(CREATE_CLAIM, "DROP FUNCTION django_jobs_claim(text, text[])"),
        migrations.RunSQL(
            CREATE_FINISH,
            "DROP FUNCTION django_jobs_finish(bigint, integer, text, text, text, text, text,"
            " boolean, float8)",
        ),
    ]
