-- The claim: a worker takes the next ready job. Workers run it inside django_jobs_claim()
-- (functions/django_jobs_claim_v<N>.sql, the newest) through call_claim. Its branches are read
-- as statements of their own, for their plans, from that file (store.claiming.claim_sql: the
-- tests, the bench), so what is read is what runs.
--
-- Pick the first ready pending job in (priority DESC, run_after, id) order, lock it with SKIP
-- LOCKED so concurrent workers pass over each other, mark it running, count the attempt and draw
-- a new lease token, and open its Attempt row: one statement, one round trip. The lock is FOR NO
-- KEY UPDATE, the mode the UPDATE takes anyway: it excludes other claims and finishes of the
-- job, but not the FOR KEY SHARE that a foreign key check takes on it while a dependent or a
-- child of the job is being enqueued in a transaction that may stay open. Jobs of skip_tasks
-- (tasks the worker has found it does not have) are passed over.
--
-- Jobs with a concurrency key, and queues that are paused or limited, take the function's
-- longer way; its three short branches claim jobs without a key only, so that a job with a key
-- is never claimed without its key's lock, and only while no such job waits and none of the
-- worker's queues is paused or limited (their guard, checked before they read a job: the
-- queue table and job_claim_key_idx, both empty when no controls are in use). Indexes: job_claim_free_idx for any queue,
-- job_claim_free_queue_idx for one queue or some, both partial on pending jobs without a
-- concurrency key, so finished jobs cost nothing however many there are. The claim of a keyed
-- candidate, once its key's slot is secured, finds it by the primary key.

-- name: call_claim
-- The worker's claim: one job for worker_id from queues (NULL: every queue), or no row.
SELECT * FROM django_jobs_claim(%(worker_id)s::text, %(queues)s::text[], %(skip_tasks)s::text[])

-- name: call_claim_with_checkpoint
-- The HTTP API's claim: call_claim, and the claimed job's checkpoint with it, so that a worker of
-- the API resumes from the claim's answer and a job costs no statement more: its recorded steps'
-- results by name and its cursors' values by name, as JSON text (NULL: none; both NULL when no
-- job was ready), read by django_jobs_checkpoint (functions/), which says why it is a function
-- and why its snapshot holds every step and cursor an earlier attempt wrote. A database worker
-- claims with call_claim, and reads the checkpoint only for a run that asks for a step or a
-- cursor (steps.sql: checkpoint). The claim is the outer side of the LATERAL join, so it runs
-- first; with no job claimed, the checkpoint is not read.
-- Index: those of django_jobs_claim and django_jobs_checkpoint.
SELECT c.*, k.steps, k.cursors
FROM django_jobs_claim(%(worker_id)s::text, %(queues)s::text[], %(skip_tasks)s::text[]) AS c
LEFT JOIN LATERAL django_jobs_checkpoint(c.id) AS k ON true

-- name: keyed_candidate
-- The keyed candidate of a claim, for reading its plan (functions/ has the function).
SELECT * FROM django_jobs_keyed_candidate(%(queues)s::text[], %(closed)s::text[],
                                          %(skip_tasks)s::text[], '{}', '{}', '{}')

-- name: free_candidate
-- The candidate without a key, for reading its plan.
SELECT * FROM django_jobs_free_candidate(%(queues)s::text[], %(closed)s::text[],
                                         %(skip_tasks)s::text[])

-- name: ready_queues
-- The HTTP API's tick (api/waiting.py): which of the queues its idle long polls wait on have a
-- ready job, asked once for all of them, so that idle waiters cost one statement a tick however
-- many sets of queues they wait on. A row per queue of %(queues)s that has a ready job and is
-- not paused, and a row '' (for the waiters of every queue) when %(any)s and any queue has one.
-- Only a hint, as a notification is: a woken waiter claims, and finds nothing if the job's key
-- or queue has no free slot. Each probe is a scalar subquery with LIMIT 1, so that it runs per
-- queue and stops at the first ready row of job_claim_free_queue_idx or job_claim_key_idx
-- (job_claim_free_idx for ''), rather than being hashed over every pending job.
SELECT q.name AS queue
FROM unnest(%(queues)s::text[]) AS q (name)
WHERE coalesce((SELECT true FROM django_jobs_job
                WHERE state = 'pending' AND concurrency_key IS NULL AND queue = q.name
                  AND run_after <= now()
                LIMIT 1),
               (SELECT true FROM django_jobs_job
                WHERE state = 'pending' AND concurrency_key IS NOT NULL AND queue = q.name
                  AND run_after <= now()
                LIMIT 1),
               false)
  AND NOT EXISTS (SELECT FROM django_jobs_queue WHERE name = q.name AND paused)
UNION ALL
SELECT ''
WHERE %(any)s
  AND coalesce((SELECT true FROM django_jobs_job
                WHERE state = 'pending' AND concurrency_key IS NULL AND run_after <= now()
                LIMIT 1),
               (SELECT true FROM django_jobs_job
                WHERE state = 'pending' AND concurrency_key IS NOT NULL AND run_after <= now()
                LIMIT 1),
               false)
