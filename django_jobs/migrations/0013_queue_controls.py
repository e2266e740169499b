"""Queue controls and concurrency limits: pause a queue, limit a queue's running jobs across all
workers, and limit the running jobs that share a concurrency key.

``django_jobs_queue`` holds a row per paused or limited queue. Jobs get ``concurrency_key`` and
``concurrency_limit``. Four partial indexes serve the claim: the claim orders, of jobs without a
key only (``job_claim_free_idx``, ``job_claim_free_queue_idx``, which replace ``job_claim_idx``
and ``job_claim_queue_idx``), so that no claim walks past jobs that wait for a key's slot; jobs
with a key by (key, queue) and claim order (``job_claim_key_idx``); running jobs by key
(``job_running_key_idx``). The views that read pending jobs (``django_jobs_queue_summary``,
``django_jobs_stuck_jobs``) read them through both parts. They are built
concurrently, and the check constraint is validated without blocking writers, so upgrading a busy
queue does not stop it.

The claim function is replaced (same arguments: workers of the previous release keep working
with it); two helper functions find its candidates. The ``django_jobs_queue_summary`` view gets
the pause and limit columns. The functions' text is as ``django_jobs/sql/functions.sql`` had it
when this migration was written; tests check that the database's functions match it.
"""

import importlib

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models
from django.db.models import Q
from django.db.models.functions import Now

# Going back restores the claim function as migration 0010 made it, and the view as 0003 did.
_PREVIOUS = importlib.import_module("django_jobs.migrations.0010_unknown_tasks_and_worker_pods")
_VIEWS = importlib.import_module("django_jobs.migrations.0003_operations").VIEWS

CREATE_KEYED_CANDIDATE = """
CREATE OR REPLACE FUNCTION django_jobs_keyed_candidate(
    p_queues text[], p_closed text[], p_skip_tasks text[], p_passed_keys text[],
    p_passed_ids bigint[]
)
RETURNS TABLE (
    id bigint, priority smallint, run_after timestamptz, queue varchar, concurrency_key varchar,
    concurrency_limit integer
)
LANGUAGE plpgsql STABLE AS $body$#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH RECURSIVE pairs(k, q) AS (
    (SELECT concurrency_key, queue FROM django_jobs_job
     WHERE state = 'pending' AND concurrency_key IS NOT NULL
     ORDER BY concurrency_key, queue LIMIT 1)
    UNION ALL
    SELECT n.concurrency_key, n.queue FROM pairs p CROSS JOIN LATERAL (
        SELECT concurrency_key, queue FROM django_jobs_job
        WHERE state = 'pending' AND concurrency_key IS NOT NULL
          AND (concurrency_key, queue) > (p.k, p.q)
        ORDER BY concurrency_key, queue LIMIT 1
    ) n
)
SELECT j.id, j.priority, j.run_after, j.queue, j.concurrency_key, j.concurrency_limit
FROM pairs p CROSS JOIN LATERAL (
    SELECT j.id, j.priority, j.run_after, j.queue, j.concurrency_key, j.concurrency_limit
    FROM django_jobs_job j
    WHERE j.state = 'pending' AND j.concurrency_key IS NOT NULL
      AND j.concurrency_key >= p.k AND j.concurrency_key <= p.k AND j.queue >= p.q
      AND j.queue <= p.q AND j.run_after <= now()
      AND (p_skip_tasks IS NULL OR j.task <> ALL(p_skip_tasks))
      AND j.id <> ALL(p_passed_ids)
    ORDER BY j.concurrency_key, j.queue, j.priority DESC, j.run_after, j.id
    LIMIT 1
) j
WHERE (p_queues IS NULL OR p.q = ANY(p_queues)) AND p.q <> ALL(p_closed)
  AND p.k <> ALL(p_passed_keys)
  AND j.concurrency_limit > (
      SELECT count(*) FROM django_jobs_job r
      WHERE r.state = 'running' AND r.concurrency_key = p.k
  )
ORDER BY j.priority DESC, j.run_after, j.id
LIMIT 1
;
END
$body$
"""

CREATE_FREE_CANDIDATE = """
CREATE OR REPLACE FUNCTION django_jobs_free_candidate(
    p_queues text[], p_closed text[], p_skip_tasks text[]
)
RETURNS TABLE (id bigint, priority smallint, run_after timestamptz, queue varchar)
LANGUAGE plpgsql STABLE AS $body$#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH RECURSIVE queues(q) AS (
    (SELECT queue FROM django_jobs_job
     WHERE state = 'pending' AND concurrency_key IS NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT n.queue FROM queues s CROSS JOIN LATERAL (
        SELECT queue FROM django_jobs_job
        WHERE state = 'pending' AND concurrency_key IS NULL AND queue > s.q
        ORDER BY queue LIMIT 1
    ) n
)
SELECT j.id, j.priority, j.run_after, j.queue
FROM queues s CROSS JOIN LATERAL (
    SELECT j.id, j.priority, j.run_after, j.queue FROM django_jobs_job j
    WHERE j.state = 'pending' AND j.concurrency_key IS NULL AND j.queue >= s.q
      AND j.queue <= s.q AND j.run_after <= now()
      AND (p_skip_tasks IS NULL OR j.task <> ALL(p_skip_tasks))
    ORDER BY j.queue, j.priority DESC, j.run_after, j.id
    LIMIT 1
) j
WHERE (p_queues IS NULL OR s.q = ANY(p_queues)) AND s.q <> ALL(p_closed)
ORDER BY j.priority DESC, j.run_after, j.id
LIMIT 1
;
END
$body$
"""

CREATE_CLAIM = """
CREATE OR REPLACE FUNCTION django_jobs_claim(p_worker_id text, p_queues text[], p_skip_tasks text[])
RETURNS TABLE (
    id bigint, task varchar, queue varchar, args text, kwargs text, attempt integer,
    max_attempts integer, timeout integer, parent_id bigint, lease uuid, attempt_id bigint
)
LANGUAGE plpgsql AS $body$#variable_conflict use_column
DECLARE
    v_queues text[] := NULLIF(p_queues, '{}');
    v_closed text[];
    v_limited text[];
    v_name text;
    v_passed_keys text[] := '{}';
    v_passed_ids bigint[] := '{}';
    v_keyed record;
    v_free record;
    v_running bigint;
    v_round integer := 0;
BEGIN
    SELECT coalesce(array_agg(q.name ORDER BY q.name) FILTER (WHERE q.paused), '{}'),
           coalesce(array_agg(q.name ORDER BY q.name) FILTER (WHERE NOT q.paused), '{}')
    INTO v_closed, v_limited
    FROM django_jobs_queue q
    WHERE (q.paused OR q.concurrency_limit IS NOT NULL)
      AND (v_queues IS NULL OR q.name = ANY(v_queues));
    IF cardinality(v_limited) > 0 THEN
        FOREACH v_name IN ARRAY v_limited LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('django_jobs.queue:' || v_name, 0));
        END LOOP;
        v_closed := v_closed || ARRAY(
            SELECT q.name::text FROM django_jobs_queue q
            WHERE q.name = ANY(v_limited) AND q.concurrency_limit <= (
                SELECT count(*) FROM django_jobs_job r WHERE r.state = 'running' AND r.queue = q.name
            )
        );
    END IF;

    IF cardinality(v_closed) = 0 AND NOT EXISTS (
        SELECT 1 FROM django_jobs_job k WHERE k.state = 'pending' AND k.concurrency_key IS NOT NULL
    ) THEN
        IF v_queues IS NULL THEN
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL
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
        ELSIF cardinality(v_queues) = 1 THEN
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL AND queue = v_queues[1]
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
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL AND queue = ANY(v_queues)
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
        RETURN;
    END IF;

    LOOP
        v_round := v_round + 1;
        IF v_round > 10 THEN
            RETURN;
        END IF;
        SELECT * INTO v_keyed FROM django_jobs_keyed_candidate(v_queues, v_closed, p_skip_tasks,
                                                               v_passed_keys, v_passed_ids);
        SELECT * INTO v_free FROM django_jobs_free_candidate(v_queues, v_closed, p_skip_tasks);
        IF v_keyed.id IS NOT NULL AND (
            v_free.id IS NULL OR v_keyed.priority > v_free.priority
            OR (v_keyed.priority = v_free.priority
                AND (v_keyed.run_after, v_keyed.id) < (v_free.run_after, v_free.id))
        ) THEN
            IF NOT pg_try_advisory_xact_lock(
                hashtextextended('django_jobs.key:' || v_keyed.concurrency_key, 0)
            ) THEN
                v_passed_keys := v_passed_keys || v_keyed.concurrency_key::text;
                CONTINUE;
            END IF;
            SELECT count(*) INTO v_running FROM django_jobs_job r
            WHERE r.state = 'running' AND r.concurrency_key = v_keyed.concurrency_key;
            IF v_running >= v_keyed.concurrency_limit THEN
                v_passed_keys := v_passed_keys || v_keyed.concurrency_key::text;
                CONTINUE;
            END IF;
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE id = v_keyed.id AND state = 'pending' AND run_after <= now()
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
            IF FOUND THEN
                RETURN;
            END IF;
            v_passed_ids := v_passed_ids || v_keyed.id;
        ELSIF v_free.id IS NOT NULL THEN
            RETURN QUERY
WITH claimed AS (
    UPDATE django_jobs_job SET state = 'running', attempt = attempt + 1, worker_id = p_worker_id,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM django_jobs_job
        WHERE state = 'pending' AND run_after <= now() AND concurrency_key IS NULL AND queue = v_free.queue
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
            IF FOUND THEN
                RETURN;
            END IF;
            v_closed := v_closed || v_free.queue::text;
        ELSE
            RETURN;
        END IF;
    END LOOP;
END
$body$
"""

DROP_CANDIDATES = [
    "DROP FUNCTION IF EXISTS django_jobs_keyed_candidate(text[], text[], text[], text[], bigint[])",
    "DROP FUNCTION IF EXISTS django_jobs_free_candidate(text[], text[], text[])",
]

# Pending jobs are read through the partial indexes of jobs without a key and of jobs with one
# (job_claim_free_queue_idx, job_claim_key_idx), which replace job_claim_idx and
# job_claim_queue_idx: the views read the two parts and add them up.
_PENDING = "FROM django_jobs_job WHERE state = 'pending' GROUP BY queue"
assert _PENDING in _VIEWS["django_jobs_queue_summary"]
COUNTS = _VIEWS["django_jobs_queue_summary"].replace(
    _PENDING,
    """FROM (
    SELECT queue, run_after FROM django_jobs_job
    WHERE state = 'pending' AND concurrency_key IS NULL
    UNION ALL
    SELECT queue, run_after FROM django_jobs_job
    WHERE state = 'pending' AND concurrency_key IS NOT NULL
) p GROUP BY queue""",
)
_LATE = """FROM django_jobs_job j
WHERE j.state = 'pending'
  AND j.run_after < now() - make_interval(secs => django_jobs_setting('late_pending_after', 900))"""
assert _LATE in _VIEWS["django_jobs_stuck_jobs"]
STUCK = "CREATE OR REPLACE VIEW django_jobs_stuck_jobs AS " + _VIEWS[
    "django_jobs_stuck_jobs"
].replace(
    _LATE,
    _LATE.replace(
        "WHERE j.state = 'pending'", "WHERE j.state = 'pending' AND j.concurrency_key IS NULL"
    )
    + "\nUNION ALL\n"
    + _VIEWS["django_jobs_stuck_jobs"][
        _VIEWS["django_jobs_stuck_jobs"].index(
            "SELECT j.id, j.queue, j.task, j.state, 'late_pending'"
        ) :
    ]
    .strip()
    .replace(
        "WHERE j.state = 'pending'", "WHERE j.state = 'pending' AND j.concurrency_key IS NOT NULL"
    ),
)
RESTORE_STUCK = (
    "CREATE OR REPLACE VIEW django_jobs_stuck_jobs AS " + _VIEWS["django_jobs_stuck_jobs"]
)

SUMMARY = """
DROP VIEW django_jobs_queue_summary;
CREATE VIEW django_jobs_queue_summary AS
SELECT s.queue, s.state, s.jobs, s.ready, s.scheduled, s.oldest_at, s.oldest_age_seconds,
       coalesce(c.paused, false) AS paused, c.paused_at, coalesce(c.paused_by, '') AS paused_by,
       coalesce(c.pause_reason, '') AS pause_reason, c.concurrency_limit
FROM (
    {counts}
    UNION ALL
    -- A paused or limited queue without pending jobs still has its row.
    SELECT c.name, 'pending'::text, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz,
           NULL::float8
    FROM django_jobs_queue c
    WHERE (c.paused OR c.concurrency_limit IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM django_jobs_job j WHERE j.state = 'pending' AND j.queue = c.name)
) s
LEFT JOIN django_jobs_queue c ON c.name = s.queue
""".replace("{counts}", COUNTS.strip())

RESTORE_SUMMARY = (
    "DROP VIEW django_jobs_queue_summary;"
    " CREATE VIEW django_jobs_queue_summary AS " + _VIEWS["django_jobs_queue_summary"]
)


def _index(name: str, *fields, condition: Q) -> AddIndexConcurrently:
    return AddIndexConcurrently(
        model_name="job", index=models.Index(*fields, name=name, condition=condition)
    )


PENDING_FREE = Q(state="pending", concurrency_key__isnull=True)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0012_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(
                blank=True,
                editable=False,
                help_text="At most concurrency_limit running jobs share this key, across all workers.",
                max_length=255,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [
                        "ALTER TABLE django_jobs_job ADD CONSTRAINT job_concurrency_limit_positive"
                        " CHECK ((concurrency_key IS NULL AND concurrency_limit IS NULL)"
                        " OR (concurrency_key IS NOT NULL AND concurrency_limit >= 1)) NOT VALID",
                        "ALTER TABLE django_jobs_job VALIDATE CONSTRAINT"
                        " job_concurrency_limit_positive",
                    ],
                    "ALTER TABLE django_jobs_job DROP CONSTRAINT job_concurrency_limit_positive",
                )
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=Q(concurrency_key__isnull=True, concurrency_limit__isnull=True)
                        | Q(concurrency_key__isnull=False, concurrency_limit__gte=1),
                        name="job_concurrency_limit_positive",
                    ),
                )
            ],
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(db_default=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("paused_by", models.CharField(blank=True, db_default="", max_length=150)),
                ("pause_reason", models.TextField(blank=True, db_default="")),
                (
                    "concurrency_limit",
                    models.IntegerField(
                        blank=True,
                        help_text="At most this many jobs of the queue run at once, across all workers. Empty: no limit.",
                        null=True,
                    ),
                ),
                (
                    "limit_source",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("", "none"),
                            ("settings", "JOBS_QUEUE_LIMITS"),
                            ("admin", "admin or jobqueue"),
                        ],
                        db_default="",
                        max_length=10,
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True, db_default=Now())),
            ],
            options={
                "db_table": "django_jobs_queue",
                "ordering": ["name"],
                "permissions": [("pause_queue", "Can pause and resume queues")],
                "constraints": [
                    models.CheckConstraint(
                        condition=Q(concurrency_limit__isnull=True) | Q(concurrency_limit__gte=1),
                        name="queue_limit_positive",
                    )
                ],
            },
        ),
        _index(
            "job_claim_free_idx",
            models.F("priority").desc(),
            "run_after",
            "id",
            condition=PENDING_FREE,
        ),
        _index(
            "job_claim_free_queue_idx",
            "queue",
            models.F("priority").desc(),
            "run_after",
            "id",
            condition=PENDING_FREE,
        ),
        _index(
            "job_claim_key_idx",
            "concurrency_key",
            "queue",
            models.F("priority").desc(),
            "run_after",
            "id",
            condition=Q(state="pending", concurrency_key__isnull=False),
        ),
        _index(
            "job_running_key_idx",
            "concurrency_key",
            condition=Q(state="running", concurrency_key__isnull=False),
        ),
        migrations.RunSQL(
            [CREATE_KEYED_CANDIDATE, CREATE_FREE_CANDIDATE, CREATE_CLAIM],
            [_PREVIOUS.DROP_CLAIM, _PREVIOUS.CREATE_CLAIM, *DROP_CANDIDATES],
        ),
        migrations.RunSQL(SUMMARY, RESTORE_SUMMARY),
        migrations.RunSQL(STUCK, RESTORE_STUCK),
        RemoveIndexConcurrently(model_name="job", name="job_claim_idx"),
        RemoveIndexConcurrently(model_name="job", name="job_claim_queue_idx"),
    ]
