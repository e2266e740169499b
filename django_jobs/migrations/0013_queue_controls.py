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
the pause and limit columns. The functions are version 5 of the claim and version 1 of
each helper in django_jobs/store/sql/functions/; going back makes the claim's version 4 again.
"""

import importlib

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models
from django.db.models import Q
from django.db.models.functions import Now

from django_jobs.store.sql.functions import function_sql

# The views as 0003 made them: this migration rewrites two, and going back restores them.
_VIEWS = importlib.import_module("django_jobs.migrations.0003_operations").VIEWS

DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[], text[])"
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
            [
                function_sql("django_jobs_keyed_candidate", 1),
                function_sql("django_jobs_free_candidate", 1),
                function_sql("django_jobs_claim", 5),
            ],
            [DROP_CLAIM, function_sql("django_jobs_claim", 4), *DROP_CANDIDATES],
        ),
        migrations.RunSQL(SUMMARY, RESTORE_SUMMARY),
        migrations.RunSQL(STUCK, RESTORE_STUCK),
        RemoveIndexConcurrently(model_name="job", name="job_claim_idx"),
        RemoveIndexConcurrently(model_name="job", name="job_claim_queue_idx"),
    ]
