-- Hourly rollups (rollups.py, store/rollups.py; tables of migration 0024): finished jobs and
-- ended attempts summed per UTC hour, queue, task and outcome, before prunejobs deletes them.
--
-- A pass rolls up the hours in [rolled_until, to) in one statement that first moves the
-- watermark (django_jobs_rollup_state, one row) from rolled_until to `to`, compare-and-set:
-- a pass that finds the row locked by another pass skips it (SKIP LOCKED: it never waits for
-- a pass), and one that starts after another committed finds the watermark moved; either
-- writes nothing. A crash rolls the whole statement back, watermark and rows together. So each
-- hour is rolled up exactly once. An hour is rolled up only once it ended more than
-- ROLLUP_DELAY ago (rollups.py), so that finishes stamped inside it (now() of their
-- transaction) have committed.

-- name: rollup_span
-- The watermark (None before the first pass: its row is written by the first pass), the last
-- hour that may be rolled up now (exclusive), before the first pass the earliest finish on
-- record (job_finished_idx and attempt_finished_minute_idx: one probe each), and where a pass
-- of at most %(span)s from the watermark would end: None when no hour is due. All in SQL, so
-- that no clock or time zone of Python's is involved.
WITH state AS (
    SELECT s.rolled_until,
           timezone('UTC', date_trunc('hour', timezone('UTC', now() - %(delay)s::interval)))
               AS closed_until,
           CASE WHEN s.rolled_until IS NULL THEN least(
               (SELECT min(finished_at) FROM django_jobs_job
                WHERE state IN ('done', 'error', 'cancelled')),
               (SELECT min(timezone('UTC', date_trunc('minute', timezone('UTC', finished_at))))
                FROM django_jobs_attempt)
           ) END AS earliest
    FROM (VALUES (1)) AS one (id)
    LEFT JOIN django_jobs_rollup_state s ON s.id = one.id
), ends AS (
    SELECT *, least(
        coalesce(rolled_until,
                 timezone('UTC', date_trunc('hour', timezone('UTC', earliest))))
            + %(span)s::interval,
        closed_until) AS pass_end
    FROM state
)
SELECT rolled_until, closed_until, earliest,
       CASE WHEN rolled_until IS NULL AND earliest IS NULL THEN NULL
            WHEN pass_end <= coalesce(rolled_until, earliest) THEN NULL
            ELSE pass_end END AS pass_end
FROM ends

-- name: roll_up
-- Roll up [from, to): move the watermark (the first pass, from None, writes its row), then
-- write the hours' rows and add them to the totals. Attempts ended in the span (attempt_finished_minute_idx: the span is whole hours, so
-- whole minutes), joined to their job by primary key; jobs finished in the span
-- (job_finished_idx). A duration d falls in bucket i (from 0), the number of %(bounds)s under
-- it: bounds[i-1] < d <= bounds[i], as Prometheus' le counts (width_bucket over the negated
-- bounds, %(negated_bounds)s, ascending). Durations and waits are summed rounded to 2^-20 s
-- (about a microsecond; the buckets and maxima take them as they are): sums of such numbers
-- are exact in float8 up to 2^33 s, so a sum is the same in whatever order it is added (the
-- totals here, the metrics page's tail there), and a counter made of them never goes back.
WITH started AS (
    -- The first pass writes the row. One that finds it there writes nothing, and, as DO
    -- NOTHING, locks nothing that the pass that wrote it would then have to skip.
    INSERT INTO django_jobs_rollup_state (id, rolled_until, rolled_at)
    SELECT 1, %(to)s, now() WHERE %(from)s::timestamptz IS NULL
    ON CONFLICT (id) DO NOTHING
    RETURNING rolled_until
), moved AS (
    UPDATE django_jobs_rollup_state SET rolled_until = %(to)s, rolled_at = now()
    WHERE id = (SELECT id FROM django_jobs_rollup_state
                WHERE id = 1 AND rolled_until IS NOT DISTINCT FROM %(from)s::timestamptz
                FOR UPDATE SKIP LOCKED)
    RETURNING rolled_until
), advanced AS (
    SELECT rolled_until FROM started UNION ALL SELECT rolled_until FROM moved
), attempts AS (
    SELECT timezone('UTC', date_trunc('hour', timezone('UTC', a.finished_at))) AS hour,
           j.queue, j.task, a.outcome,
           greatest(extract(epoch FROM a.finished_at - a.started_at)::float8, 0) AS seconds,
           round(greatest(extract(epoch FROM a.finished_at - a.started_at)::float8, 0)
                 * 1048576) / 1048576 AS summed
    FROM django_jobs_attempt a
    JOIN django_jobs_job j ON j.id = a.job_id
    WHERE EXISTS (SELECT 1 FROM advanced)
      AND timezone('UTC', date_trunc('minute', timezone('UTC', a.finished_at)))
          >= coalesce(%(from)s::timestamptz, '-infinity')
      AND timezone('UTC', date_trunc('minute', timezone('UTC', a.finished_at))) < %(to)s
), jobs AS (
    SELECT timezone('UTC', date_trunc('hour', timezone('UTC', j.finished_at))) AS hour,
           j.queue, j.task, j.state AS outcome,
           CASE WHEN j.started_at IS NOT NULL
                THEN round(greatest(extract(epoch FROM j.started_at - j.run_after)::float8, 0)
                           * 1048576) / 1048576
           END AS waited
    FROM django_jobs_job j
    WHERE EXISTS (SELECT 1 FROM advanced)
      AND j.state IN ('done', 'error', 'cancelled')
      AND j.finished_at >= coalesce(%(from)s::timestamptz, '-infinity')
      AND j.finished_at < %(to)s
), by_bucket AS (
    SELECT hour, queue, task, outcome,
           cardinality(%(bounds)s::float8[])
               - width_bucket(-seconds, %(negated_bounds)s::float8[]) AS bucket, count(*) AS n
    FROM attempts GROUP BY 1, 2, 3, 4, 5
), attempt_rows AS (
    SELECT hour, queue, task, outcome, count(*) AS attempts, sum(summed) AS seconds_total,
           max(seconds) AS seconds_max
    FROM attempts GROUP BY 1, 2, 3, 4
), job_rows AS (
    SELECT hour, queue, task, outcome, count(*) AS jobs, count(waited) AS waited_jobs,
           coalesce(sum(waited), 0) AS wait_total, max(waited) AS wait_max
    FROM jobs GROUP BY 1, 2, 3, 4
), bucket_arrays AS (
    -- One array per key, every bucket present (0 where none fell): a hash join on the key.
    SELECT k.hour, k.queue, k.task, k.outcome,
           array_agg(coalesce(bb.n, 0) ORDER BY i.i) AS duration_buckets
    FROM attempt_rows k
    CROSS JOIN generate_series(0, cardinality(%(bounds)s::float8[])) AS i (i)
    LEFT JOIN by_bucket bb
      ON bb.hour = k.hour AND bb.queue = k.queue AND bb.task = k.task
     AND bb.outcome = k.outcome AND bb.bucket = i.i
    GROUP BY k.hour, k.queue, k.task, k.outcome
), hourly AS (
    SELECT k.hour, k.queue, k.task, k.outcome,
           coalesce(jr.jobs, 0) AS jobs, coalesce(ar.attempts, 0) AS attempts,
           coalesce(ar.seconds_total, 0) AS duration_seconds_total,
           ar.seconds_max AS duration_seconds_max,
           coalesce(ba.duration_buckets,
                    array_fill(0::bigint, ARRAY[cardinality(%(bounds)s::float8[]) + 1]))
               AS duration_buckets,
           coalesce(jr.waited_jobs, 0) AS waited_jobs, coalesce(jr.wait_total, 0) AS wait_total,
           jr.wait_max
    FROM (SELECT hour, queue, task, outcome FROM attempt_rows
          UNION SELECT hour, queue, task, outcome FROM job_rows) k
    LEFT JOIN attempt_rows ar USING (hour, queue, task, outcome)
    LEFT JOIN job_rows jr USING (hour, queue, task, outcome)
    LEFT JOIN bucket_arrays ba USING (hour, queue, task, outcome)
), written AS (
    INSERT INTO django_jobs_rollup
        (hour, queue, task, outcome, jobs, attempts, duration_seconds_total,
         duration_seconds_max, duration_buckets, waited_jobs, wait_seconds_total,
         wait_seconds_max)
    SELECT hour, queue, task, outcome, jobs, attempts, duration_seconds_total,
           duration_seconds_max, duration_buckets, waited_jobs, wait_total, wait_max
    FROM hourly
    RETURNING 1
), span_buckets AS (
    SELECT queue, task, outcome, array_agg(n ORDER BY i) AS duration_buckets
    FROM (
        SELECT h.queue, h.task, h.outcome, b.i, sum(b.n)::bigint AS n
        FROM hourly h, unnest(h.duration_buckets) WITH ORDINALITY AS b (n, i)
        GROUP BY h.queue, h.task, h.outcome, b.i
    ) per_bucket
    GROUP BY queue, task, outcome
), span_totals AS (
    SELECT h.queue, h.task, h.outcome, sum(h.jobs) AS jobs, sum(h.attempts) AS attempts,
           sum(h.duration_seconds_total) AS duration_seconds_total,
           max(h.duration_seconds_max) AS duration_seconds_max,
           sb.duration_buckets,
           sum(h.waited_jobs) AS waited_jobs, sum(h.wait_total) AS wait_total,
           max(h.wait_max) AS wait_max
    FROM hourly h
    JOIN span_buckets sb USING (queue, task, outcome)
    GROUP BY h.queue, h.task, h.outcome, sb.duration_buckets
), totals AS (
    INSERT INTO django_jobs_rollup_total AS t
        (queue, task, outcome, jobs, attempts, duration_seconds_total, duration_seconds_max,
         duration_buckets, waited_jobs, wait_seconds_total, wait_seconds_max)
    SELECT queue, task, outcome, jobs, attempts, duration_seconds_total, duration_seconds_max,
           duration_buckets, waited_jobs, wait_total, wait_max
    FROM span_totals
    ON CONFLICT (queue, task, outcome) DO UPDATE SET
        jobs = t.jobs + EXCLUDED.jobs,
        attempts = t.attempts + EXCLUDED.attempts,
        duration_seconds_total = t.duration_seconds_total + EXCLUDED.duration_seconds_total,
        duration_seconds_max = greatest(t.duration_seconds_max, EXCLUDED.duration_seconds_max),
        duration_buckets = ARRAY(
            SELECT coalesce(o.n, 0) + coalesce(e.n, 0)
            FROM unnest(t.duration_buckets) WITH ORDINALITY AS o (n, i)
            FULL JOIN unnest(EXCLUDED.duration_buckets) WITH ORDINALITY AS e (n, i) USING (i)
            ORDER BY i),
        waited_jobs = t.waited_jobs + EXCLUDED.waited_jobs,
        wait_seconds_total = t.wait_seconds_total + EXCLUDED.wait_seconds_total,
        wait_seconds_max = greatest(t.wait_seconds_max, EXCLUDED.wait_seconds_max)
    RETURNING 1
)
SELECT (SELECT count(*) FROM advanced) AS advanced, (SELECT count(*) FROM written) AS rows,
       (SELECT count(*) FROM totals) AS totals

-- name: prune_rollups
-- Delete the hourly rows older than the rollups' retention, a batch at a time (the unique
-- index rollup_once_per_hour, whose leading column is the hour). The totals stay.
WITH gone AS (
    DELETE FROM django_jobs_rollup WHERE id IN (
        SELECT id FROM django_jobs_rollup WHERE hour < now() - %(age)s::interval
        ORDER BY hour LIMIT %(batch_size)s
    ) RETURNING 1
)
SELECT count(*) AS deleted FROM gone

-- name: rolled_until
-- The watermark: jobs finished before it are in the rollups (prunejobs deletes no later one).
SELECT rolled_until FROM django_jobs_rollup_state WHERE id = 1

-- name: task_days
-- For the %(tasks)s tasks that ended the most jobs over the last %(days)s UTC days (today
-- included): per task, UTC day and outcome, the hourly rows summed; the successful attempts'
-- duration buckets summed position by position over the whole period (only those: the
-- percentiles are of successful runs). Days are UTC dates, and `today` is the database's, so
-- that no time zone of Python's is involved. Reads the unique index rollup_once_per_hour (the
-- hour first) for the period, whatever the size of the job table; the buckets of the chosen
-- tasks' successful hours only (rollup_task_outcome_hour_idx).
WITH period AS (
    SELECT (timezone('UTC', now()))::date AS today,
           timezone('UTC', ((timezone('UTC', now()))::date - (%(days)s - 1))::timestamp)
               AS since
), hours AS (
    SELECT r.task, r.outcome, (timezone('UTC', r.hour))::date AS day, r.jobs, r.attempts,
           r.duration_seconds_total
    FROM django_jobs_rollup r, period p
    WHERE r.hour >= p.since
), busiest AS (
    SELECT task FROM hours GROUP BY task ORDER BY sum(jobs) DESC, task LIMIT %(tasks)s
), sums AS (
    SELECT h.task, h.day, h.outcome, sum(h.jobs)::bigint AS jobs,
           sum(h.attempts)::bigint AS attempts, sum(h.duration_seconds_total)::float8 AS seconds
    FROM hours h JOIN busiest USING (task)
    GROUP BY h.task, h.day, h.outcome
), buckets AS (
    SELECT task, array_agg(n ORDER BY i) AS buckets
    FROM (
        SELECT r.task, b.i, sum(b.n)::bigint AS n
        FROM busiest t
        JOIN django_jobs_rollup r ON r.task = t.task AND r.outcome = 'done'
        CROSS JOIN period p
        CROSS JOIN LATERAL unnest(r.duration_buckets) WITH ORDINALITY AS b (n, i)
        WHERE r.hour >= p.since
        GROUP BY r.task, b.i
    ) per_bucket
    GROUP BY task
)
SELECT s.task, s.day, s.outcome, s.jobs, s.attempts, s.seconds,
       CASE WHEN s.outcome = 'done' THEN coalesce(b.buckets, '{}'::bigint[])
            ELSE '{}'::bigint[] END AS buckets,
       p.today
FROM sums s
CROSS JOIN period p
LEFT JOIN buckets b ON b.task = s.task AND s.outcome = 'done'
ORDER BY s.task, s.day, s.outcome

-- name: hourly_attempts
-- The dashboard's chart: attempts ended per UTC hour in the rolled-up hours from %(since)s on,
-- done and failed (states.FAILED_OUTCOMES), summed over queues and tasks; with the
-- watermark, so that the hours after it are read from the attempts instead. Reads the unique
-- index rollup_once_per_hour (the hour first), whatever the size of the job table.
SELECT r.hour,
       coalesce(sum(r.attempts) FILTER (WHERE r.outcome = 'done'), 0)::bigint AS done,
       coalesce(sum(r.attempts) FILTER (WHERE r.outcome = ANY (%(failed)s)), 0)::bigint AS failed
FROM django_jobs_rollup r
WHERE r.hour >= %(since)s
GROUP BY r.hour
ORDER BY r.hour
