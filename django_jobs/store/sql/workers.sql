-- The worker registry: heartbeats, and what the reaper reads and forgets.

-- name: heartbeat
-- Refresh the worker's registry row (re-creating it if a reaper removed it) and, in the same
-- round trip, read back the jobs this worker believes it runs: whether it still holds each
-- lease, and whether cancellation was requested. Only the small worker table is written, so job
-- rows are not churned by heartbeats.
-- Each lease is checked by its token, so a lease that a crash rolled back and a later claim of
-- the same job (by this very worker, even) are told apart.
-- It also lists orphans: jobs running under this worker's id that the worker does not know of,
-- with their leases. A claim whose reply was lost with the connection leaves one: the worker
-- releases it without counting the attempt. So does a finish that committed and was lost again
-- (a failover to a standby that had not received it): the worker still has that finish in
-- memory and writes it again (see worker/writes.py and reaper.recover_orphans).
-- Index: the worker table's primary key; the job table's primary key for the listed ids;
-- job_running_worker_idx for the orphans.
WITH beat AS (
    INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency, pod, tasks,
                                    started_at, last_seen_at)
    VALUES (%(id)s, %(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(pod)s,
            %(tasks)s::jsonb, now(), now())
    ON CONFLICT (id) DO UPDATE SET last_seen_at = now()
    RETURNING id
)
SELECT j.id AS job_id,
       j.state = 'running' AND j.worker_id = %(id)s AND j.lease = l.lease AS held,
       j.cancel_requested,
       false AS orphan,
       l.lease::text AS token,
       j.attempt
FROM unnest(%(job_ids)s::bigint[], %(leases)s::uuid[]) AS l(id, lease)
JOIN django_jobs_job j ON j.id = l.id
WHERE EXISTS (SELECT 1 FROM beat)
UNION ALL
SELECT o.id, false, o.cancel_requested, true, o.lease::text, o.attempt
FROM django_jobs_job o
WHERE o.state = 'running' AND o.worker_id = %(id)s AND o.id <> ALL(%(known_ids)s::bigint[])
  AND EXISTS (SELECT 1 FROM beat)

-- name: register_worker
-- The HTTP API's claims (a claim, a finish that claims the next job) register their worker, once
-- per heartbeat interval, so that the reaper knows it: the heartbeat's refresh of the worker's
-- row without its report on leases and orphans, which nobody would read. Sent in the same round
-- trip and transaction as the claim (store.claim and finish_then_claim, register=).
-- Index: the worker table's primary key.
INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency, pod, tasks,
                                started_at, last_seen_at)
VALUES (%(id)s, %(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(pod)s,
        %(tasks)s::jsonb, now(), now())
ON CONFLICT (id) DO UPDATE SET last_seen_at = now()

-- name: unregister_worker
-- A worker that stops removes its own row. Index: the worker table's primary key.
DELETE FROM django_jobs_worker WHERE id = %(id)s

-- name: running_jobs
-- The reaper's view of every running job, with what it judges them by: its worker's row (absent
-- when the worker never registered or was forgotten), how long that worker has been silent, and
-- whether the job overran its timeout plus a grace period. The reaper (reaper.py) and the
-- liveness check decide which of them are lost; this statement selects them all.
-- Index: job_running_worker_idx (partial on running), so the cost follows the number of running
-- jobs, not the table's size.
SELECT j.id AS job_id, j.attempt, j.worker_id, j.lease::text AS token, j.task, j.max_attempts,
       j.timeout,
       j.queue, EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS running_for,
       w.id IS NULL AS unregistered, w.host, w.pid,
       EXTRACT(EPOCH FROM now() - w.last_seen_at)::float8 AS silent_for,
       j.timeout IS NOT NULL
           AND j.started_at < now() - make_interval(secs => j.timeout + %(timeout_grace)s)
           AS overdue
FROM django_jobs_job j
LEFT JOIN django_jobs_worker w ON w.id = j.worker_id
WHERE j.state = 'running'
ORDER BY j.id

-- name: delete_silent_worker
-- Forget a dead worker: only once none of its jobs is running any more, and only if it is still
-- silent, re-checked in this very statement. A worker that sent a heartbeat since the reaper
-- judged it keeps its row; one that was silent that long stops claiming until a heartbeat has
-- registered it again (worker/supervisor.py).
-- Index: the worker table's primary key; job_running_worker_idx.
DELETE FROM django_jobs_worker w
WHERE w.id = %(id)s
  AND w.last_seen_at < now() - make_interval(secs => %(silence)s::float8)
  AND NOT EXISTS (SELECT 1 FROM django_jobs_job j WHERE j.state = 'running' AND j.worker_id = w.id)
RETURNING w.id

-- name: worker_pods
-- The Kubernetes pods that these workers recorded as their own, with the boot (pod uid and
-- container id) the liveness check saw of each before ("" until it has seen one).
-- Index: the worker table's primary key.
SELECT id AS worker_id, pod, boot_id
FROM django_jobs_worker
WHERE id = ANY(%(ids)s::text[]) AND pod <> ''

-- name: record_worker_boot
-- What a worker's container looked like when the liveness check first saw it, so that a later
-- pass notices a restart. Only the first boot is kept. Index: the worker table's primary key.
UPDATE django_jobs_worker SET boot_id = %(boot_id)s WHERE id = %(id)s AND boot_id = ''
