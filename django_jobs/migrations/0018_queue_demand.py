"""The ``django_jobs_queue_demand`` view: per queue, the worker slots its jobs want now, for an
autoscaler (KEDA's PostgreSQL scaler in deploy/kubernetes/keda.yaml) or a dashboard.

Pending jobs are read through the two partial indexes of the claim (jobs without a concurrency
key and with one), running jobs through ``job_running_worker_idx``, as the other views do.
"""

from django.db import migrations

# One row per queue with ready or running jobs. slots_wanted: the running jobs, plus the ready
# jobs a claim could take now: none in a paused queue, none past a queue's limit. (A concurrency
# key's limit is not counted: its ready jobs count in full, an upper bound.)
DEMAND_VIEW = """
CREATE VIEW django_jobs_queue_demand AS
SELECT d.queue, d.ready, d.running,
       coalesce(c.paused, false) AS paused, c.concurrency_limit,
       CASE WHEN coalesce(c.paused, false) THEN d.running
            WHEN c.concurrency_limit IS NOT NULL
                THEN GREATEST(d.running, LEAST(d.ready + d.running, c.concurrency_limit::bigint))
            ELSE d.ready + d.running
       END AS slots_wanted
FROM (
    SELECT queue, sum(ready)::bigint AS ready, sum(running)::bigint AS running
    FROM (
        SELECT queue, count(*) AS ready, 0::bigint AS running
        FROM django_jobs_job
        WHERE state = 'pending' AND concurrency_key IS NULL AND run_after <= now()
        GROUP BY queue
        UNION ALL
        SELECT queue, count(*), 0
        FROM django_jobs_job
        WHERE state = 'pending' AND concurrency_key IS NOT NULL AND run_after <= now()
        GROUP BY queue
        UNION ALL
        SELECT queue, 0, count(*)
        FROM django_jobs_job
        WHERE state = 'running'
        GROUP BY queue
    ) parts
    GROUP BY queue
) d
LEFT JOIN django_jobs_queue c ON c.name = d.queue
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0017_when_queue_paused"),
    ]

    operations = [
        migrations.RunSQL(DEMAND_VIEW, "DROP VIEW IF EXISTS django_jobs_queue_demand"),
    ]
