-- Alerts (alerts.py, store/alerts.py): the thresholds of the django_jobs_alerts view, and reads
-- of it. The view itself is made by migration 0022 (see docs/operations.md).

-- name: sync_alert_thresholds
-- Make django_jobs_alert_threshold hold exactly the rows given, in one statement: the rows not
-- given are deleted, new ones inserted, changed ones updated; unchanged ones are not written.
-- Two processes syncing at once meet at the unique (kind, subject), not in an error.
WITH wanted AS (
    SELECT * FROM unnest(%(kinds)s::text[], %(subjects)s::text[], %(values)s::float8[])
        AS w (kind, subject, value)
), removed AS (
    DELETE FROM django_jobs_alert_threshold t
    WHERE NOT EXISTS (SELECT 1 FROM wanted w WHERE w.kind = t.kind AND w.subject = t.subject)
    RETURNING 1
), written AS (
    INSERT INTO django_jobs_alert_threshold (kind, subject, value, updated_at)
    SELECT kind, subject, value, now() FROM wanted
    ON CONFLICT (kind, subject) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
    WHERE django_jobs_alert_threshold.value IS DISTINCT FROM EXCLUDED.value
    RETURNING 1
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM removed) AS removed

-- name: alerts
-- Every firing alert, critical first.
SELECT * FROM django_jobs_alerts
ORDER BY severity = 'critical' DESC, kind, since, subject
