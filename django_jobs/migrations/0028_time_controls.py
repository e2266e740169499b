"""Time-based controls: rate limits, deadlines and fair queues.

- Jobs get ``rate_key``, ``rate_limit`` and ``rate_period`` (at most ``rate_limit`` starts of the
  key in any window of ``rate_period`` seconds) and ``expires_at`` (a job not started by then is
  never claimed, and ends cancelled as expired). Queues get a rate limit of their own
  (``JOBS_QUEUE_RATE_LIMITS``) and ``fair`` (``JOBS_FAIR_QUEUES``).
- ``django_jobs_rate`` holds each rate-limited key's latest starts: one row per key.
- Version 9 of the claim, version 2 of its two candidates, and the two functions of the rate
  windows (django_jobs/store/sql/functions/). Restart the workers after migrating.
- The view ``django_jobs_rate_limits``: each key's window and its next possible start.

The columns are added without a rewrite of the job table; the constraint is added NOT VALID and
then validated (which locks no writer out), and the expiry index is built concurrently.
"""

import django.db.models.functions.datetime
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models import Q

import django_jobs.models.fields
from django_jobs.store.sql.functions import function_sql, replace_function

DROP_KEYED_V1 = (
    "DROP FUNCTION IF EXISTS django_jobs_keyed_candidate(text[], text[], text[], text[], bigint[])"
)
DROP_KEYED_V2 = (
    "DROP FUNCTION IF EXISTS"
    " django_jobs_keyed_candidate(text[], text[], text[], text[], bigint[], text[])"
)
DROP_RATES = [
    "DROP FUNCTION IF EXISTS django_jobs_rate_take(text, integer, integer)",
    "DROP FUNCTION IF EXISTS django_jobs_rate_room(text, integer, integer)",
]

RATE_LIMITS_VIEW = """
CREATE VIEW django_jobs_rate_limits AS
-- Each rate-limited key's window (a task's name or a rate_key: kind 'key'; a queue: kind
-- 'queue'): its limit, the starts in the current window, and when the next start may happen
-- (now() when there is room). Read by the primary key of django_jobs_rate, a row per key.
SELECT split_part(r.key, ':', 1) AS kind,
       substr(r.key, length(split_part(r.key, ':', 1)) + 2) AS name,
       r.rate_limit, r.rate_period,
       (SELECT count(*) FROM unnest(r.starts) AS s
        WHERE s > now() - make_interval(secs => r.rate_period))::integer AS starts_in_window,
       greatest(coalesce(r.free_at, now()), now()) AS next_start,
       (r.free_at IS NOT NULL AND r.free_at > now()) AS is_full,
       r.starts[cardinality(r.starts)] AS last_start
FROM django_jobs_rate r
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobs", "0027_rollup_buckets_without_contrib_postgres"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateWindow",
            fields=[
                ("key", models.CharField(max_length=300, primary_key=True, serialize=False)),
                (
                    "starts",
                    django_jobs.models.fields.PgArray(base_type="timestamptz", default=list),
                ),
                ("rate_limit", models.IntegerField()),
                ("rate_period", models.IntegerField()),
                ("free_at", models.DateTimeField(blank=True, null=True)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "django_jobs_rate",
                "ordering": ["key"],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="expires_at",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text="A job that has not started by then is never claimed: it ends cancelled, as expired. Empty: no deadline.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_key",
            field=models.CharField(
                blank=True,
                editable=False,
                help_text="At most rate_limit attempts of jobs with this key start in any window of rate_period seconds, across all workers.",
                max_length=255,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_limit",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_period",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="fair",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_limit",
            field=models.IntegerField(
                blank=True,
                help_text="At most this many jobs of the queue start in any window of rate_period seconds, across all workers. Empty: no rate limit.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_period",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_source",
            field=models.CharField(
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
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("expires_at"),
                condition=Q(state="pending", expires_at__isnull=False),
                name="job_expiry_idx",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [
                        "ALTER TABLE django_jobs_job ADD CONSTRAINT job_rate_limit_positive"
                        " CHECK ((rate_key IS NULL AND rate_limit IS NULL AND rate_period IS NULL)"
                        " OR (rate_key IS NOT NULL AND rate_limit >= 1 AND rate_period >= 1))"
                        " NOT VALID",
                        "ALTER TABLE django_jobs_job VALIDATE CONSTRAINT job_rate_limit_positive",
                    ],
                    "ALTER TABLE django_jobs_job DROP CONSTRAINT job_rate_limit_positive",
                )
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=Q(
                            rate_key__isnull=True, rate_limit__isnull=True, rate_period__isnull=True
                        )
                        | Q(rate_key__isnull=False, rate_limit__gte=1, rate_period__gte=1),
                        name="job_rate_limit_positive",
                    ),
                )
            ],
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("rate_limit__isnull", True), ("rate_period__isnull", True)),
                    models.Q(("rate_limit__gte", 1), ("rate_period__gte", 1)),
                    _connector="OR",
                ),
                name="queue_rate_positive",
            ),
        ),
        migrations.RunSQL(
            [
                function_sql("django_jobs_rate_room", 1),
                function_sql("django_jobs_rate_take", 1),
                DROP_KEYED_V1,
                function_sql("django_jobs_keyed_candidate", 2),
                function_sql("django_jobs_free_candidate", 2),
            ],
            [
                DROP_KEYED_V2,
                function_sql("django_jobs_keyed_candidate", 1),
                function_sql("django_jobs_free_candidate", 1),
                *DROP_RATES,
            ],
        ),
        replace_function("django_jobs_claim", 9),
        migrations.RunSQL(RATE_LIMITS_VIEW, "DROP VIEW IF EXISTS django_jobs_rate_limits"),
    ]
