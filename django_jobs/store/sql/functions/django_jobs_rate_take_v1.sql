-- Record a start of the rate-limited key p_key at now(): after django_jobs_rate_room said it
-- fits and the claim took the job, in the same transaction (the row is locked by then). Keeps
-- the latest p_limit starts, oldest first, so the row's size follows the limit, not the jobs;
-- and sets free_at when the window is now full (see django_jobs_rate_room).
-- Made by 0028_time_controls.
CREATE OR REPLACE FUNCTION django_jobs_rate_take(p_key text, p_limit integer, p_period integer)
RETURNS void
LANGUAGE sql AS $body$
UPDATE django_jobs_rate r
SET starts = w.starts,
    free_at = CASE WHEN cardinality(w.starts) >= p_limit
                   THEN w.starts[1] + make_interval(secs => p_period) + interval '1 microsecond'
              END,
    rate_limit = p_limit, rate_period = p_period, updated_at = now()
FROM (
    SELECT ARRAY(
        SELECT s FROM (
            SELECT s FROM unnest(
                (SELECT starts FROM django_jobs_rate WHERE key = p_key) || now()
            ) AS s
            ORDER BY s DESC LIMIT p_limit
        ) latest ORDER BY s
    ) AS starts
) w
WHERE r.key = p_key
$body$
