-- Whether one more start of the rate-limited key p_key fits: at most p_limit starts in any
-- window of p_period seconds (rates.py). The claim calls it before it claims a rate-limited job,
-- in the claim's transaction, and django_jobs_rate_take after the claim succeeded.
--
-- The window slides. django_jobs_rate holds, per key, the latest p_limit start times, oldest
-- first. A start at now() fits when fewer than p_limit are recorded, or the oldest of the latest
-- p_limit is more than p_period before now(): then any window of p_period seconds that holds
-- the new start holds at most p_limit - 1 recorded ones (a recorded start later than now(), from
-- a claim whose transaction began later but committed first, counts too). Fixed buckets would
-- allow twice the limit across a bucket's edge.
--
-- The key's row is locked FOR UPDATE SKIP LOCKED, held until the claim commits (milliseconds):
-- a key another claim is taking a start of is passed over, never waited for, so that claims
-- of one key take turns and each sees the start the one before committed. A row missing is
-- made (and so locked). When the window is full, free_at says when a start fits again; the
-- claim's candidates pass over the key's jobs until then, without reading or locking them.
-- The state is a table row written in the claim's transaction: a crash cannot lose a start that
-- a committed claim made, so no burst follows a restart.
-- Made by 0028_time_controls.
CREATE OR REPLACE FUNCTION django_jobs_rate_room(p_key text, p_limit integer, p_period integer)
RETURNS boolean
LANGUAGE plpgsql AS $body$
DECLARE
    v_starts timestamptz[];
    v_count integer;
    v_oldest timestamptz;
BEGIN
    SELECT r.starts INTO v_starts FROM django_jobs_rate r WHERE r.key = p_key
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        INSERT INTO django_jobs_rate (key, starts, rate_limit, rate_period, free_at, updated_at)
        VALUES (p_key, '{}', p_limit, p_period, NULL, now())
        ON CONFLICT (key) DO NOTHING;
        -- Not inserted: the row exists and another claim holds it.
        RETURN FOUND;
    END IF;
    v_count := coalesce(cardinality(v_starts), 0);
    IF v_count < p_limit THEN
        RETURN true;
    END IF;
    v_oldest := v_starts[v_count - p_limit + 1];
    IF v_oldest < now() - make_interval(secs => p_period) THEN
        RETURN true;
    END IF;
    UPDATE django_jobs_rate
    SET free_at = v_oldest + make_interval(secs => p_period) + interval '1 microsecond',
        rate_limit = p_limit, rate_period = p_period
    WHERE key = p_key;
    RETURN false;
END
$body$
