"""Jobs whose task no worker has yet, and what a worker registry row says of its worker.

A worker hands back a job whose task it has not registered (a rolling deploy) without counting
an attempt, and passes over that task's jobs for a while: the claim function takes a third
argument, the tasks to pass over. ``task_missing_since`` marks since when workers have been
found without a job's task; ``JOBS_UNKNOWN_TASK_TIMEOUT`` counts from there, and a finish, a
reap or a release clears it, so the finish function is made again too. Both functions are
dropped and made again: restart the workers after migrating. Their bodies are the statements of
``django_jobs/transitions.py`` as they were when this migration was written; tests check that
the database's functions match them.

A worker row records the worker's pod (``POD_NAME``), which Kubernetes liveness looks up, and
the task names the worker has registered. Every column is added without a rewrite of its table.
"""

import importlib

from django.db import migrations, models

# Going back restores the functions as migration 0009 made them.
_PREVIOUS = importlib.import_module("django_jobs.migrations.0009_children_of_an_attempt")
_ORIGINAL = importlib.import_module("django_jobs.migrations.0007_lease_tokens")

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
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
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
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
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
          AND (p_skip_tasks::text[] IS NULL OR task <> ALL(p_skip_tasks::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
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
                   CASE WHEN NOT EXISTS (
                       SELECT 1 FROM django_jobs_job c
                       WHERE c.parent_id = j.id AND c.state IN ('waiting', 'pending', 'running')
                         AND (c.parent_attempt IS NULL OR c.parent_attempt = j.attempt)
                   ) THEN 'done'
                   WHEN cancel_requested THEN 'cancelled'
                   ELSE 'waiting' END
               WHEN cancel_requested OR p_outcome = 'cancelled' THEN 'cancelled'
               WHEN p_retryable AND attempt < max_attempts THEN 'pending'
               ELSE 'error'
           END AS new_state
    FROM django_jobs_job j
    WHERE id = p_job_id AND state = 'running' AND attempt = p_attempt
      AND worker_id = p_worker_id AND lease IS NOT DISTINCT FROM p_lease::uuid
    FOR NO KEY UPDATE
), job AS (
    UPDATE django_jobs_job j
    SET state = t.new_state,
        finished_at = CASE WHEN t.new_state IN ('pending', 'waiting') THEN NULL ELSE now() END,
        run_after = CASE WHEN t.new_state = 'pending'
                         THEN now() + make_interval(secs => p_retry_delay)
                         ELSE j.run_after END,
        worker_id = CASE WHEN t.new_state = 'pending' THEN NULL ELSE j.worker_id END,
        result = p_result::jsonb,
        error = p_error,
        task_missing_since = NULL
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, j.state, j.parent_id, j.attempt
), closed AS (
    UPDATE django_jobs_attempt a
    SET finished_at = now(), outcome = p_outcome, error = p_error, traceback = p_traceback
    FROM target t
    WHERE a.job_id = t.id AND a.number = t.attempt AND a.worker_id = p_worker_id
      AND a.lease IS NOT DISTINCT FROM p_lease::uuid AND a.outcome = 'running'
)
SELECT state, parent_id,
       EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = job.id),
       EXISTS (SELECT 1 FROM django_jobs_job c
               WHERE c.parent_id = job.id AND c.state IN ('waiting', 'pending', 'running')
                 AND (c.parent_attempt IS NULL OR c.parent_attempt = job.attempt))
FROM job
;
END
"""

CREATE_CLAIM = f"""
CREATE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[], p_skip_tasks text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, lease uuid, attempt_id bigint
)
LANGUAGE plpgsql AS $body${CLAIM_BODY}$body$
"""
DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[], text[])"

CREATE_FINISH = _PREVIOUS.CREATE_FINISH.replace(_PREVIOUS.FINISH_BODY, FINISH_BODY)


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0009_children_of_an_attempt"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="task_missing_since",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text="When a worker first handed the job back because it has not registered the task (a rolling deploy, say). JOBS_UNKNOWN_TASK_TIMEOUT counts from here.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="pod",
            field=models.CharField(
                blank=True,
                db_default="",
                help_text="The worker's Kubernetes pod (POD_NAME), for liveness checks; empty elsewhere.",
                max_length=253,
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="tasks",
            field=models.JSONField(
                db_default=models.Value([], models.JSONField()),
                help_text="The task names this worker has registered.",
            ),
        ),
        migrations.RunSQL(
            [_ORIGINAL.DROP_CLAIM, CREATE_CLAIM], [DROP_CLAIM, _PREVIOUS.CREATE_CLAIM]
        ),
        migrations.RunSQL(
            [_ORIGINAL.DROP_NEW_FINISH, CREATE_FINISH],
            [_ORIGINAL.DROP_NEW_FINISH, _PREVIOUS.CREATE_FINISH],
        ),
    ]
