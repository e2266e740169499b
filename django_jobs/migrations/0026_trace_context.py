"""The trace context a job was enqueued in: ``trace_context``, the W3C trace context
(``traceparent``, ``tracestate``) of the OpenTelemetry span that was active, NULL without one.
Each run's span links to it.

The claim returns it: version 8 of the claim function, whose result has the column more, so the
function is dropped and made again; restart the workers after migrating. The column is added
without a rewrite of the table. Going back makes version 7 again.
"""

from django.db import migrations, models

from django_jobs.store.sql.functions import replace_function

DROP_CLAIM = "DROP FUNCTION IF EXISTS django_jobs_claim(text, text[], text[])"


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0025_alert_baselines_from_rollups")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="The W3C trace context (traceparent, tracestate) of the span that enqueued the job, with OpenTelemetry installed; each run's span links to it. Empty: no span was active.",
                null=True,
            ),
        ),
        replace_function("django_jobs_claim", 8, drop=DROP_CLAIM, reverse_drop=DROP_CLAIM),
    ]
