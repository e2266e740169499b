-- The election of the one worker of a queue set that wakes on notifications (worker/wakeup.py).
-- All of these run on the worker's LISTEN connection, never on its queue connection: they hold
-- a session advisory lock, which a transaction-pooling pgbouncer could not keep.

-- name: listener_session
-- Once per LISTEN connection: no server default may cancel the wait in line (the wait bounds
-- itself, below), and the lock's key is kept in the session for wait_to_listen.
SELECT set_config('statement_timeout', '0', false),
       set_config('lock_timeout', '0', false),
       set_config('idle_in_transaction_session_timeout', '0', false),
       set_config('django_jobs.listener_key', %(key)s, false)

-- name: wait_to_listen
-- Wait in line (PostgreSQL grants an advisory lock's waiters in the order they came) for the
-- session advisory lock of this worker's queue set, for at most 2 seconds: a waiting statement
-- holds a snapshot, which would hold back vacuum of every table if it waited for hours. A wait
-- that runs out is caught here, so that it is not logged as an error; the worker then queues
-- again. Returns 'on' if this session now holds the lock. Sent without waiting for the reply, so
-- that the worker's loop goes on; the reply (and the notifications held back during the wait)
-- arrive on the socket the loop watches.
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '2s', true);
    PERFORM pg_advisory_lock(current_setting('django_jobs.listener_key')::bigint);
    PERFORM set_config('django_jobs.listening', 'on', false);
EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('django_jobs.listening', 'off', false);
END
$$;
SELECT current_setting('django_jobs.listening')

-- name: hand_over_listening
-- The listening worker leaves (its slots are full, or it stops). It tells its successor, on
-- the django_jobs_listener channel, whether ready jobs are left for it to claim at once: a
-- bulk enqueue sends one notification for all its jobs, which this worker has used up. It runs,
-- and commits, before the unlock, so that the successor receives it with the notifications
-- that reached it while it waited, and after them: the successor reacts only to the ones that
-- come after it. Each EXISTS stops at the first ready row of job_claim_free_idx,
-- job_claim_free_queue_idx or job_claim_key_idx (paused queues and full concurrency keys count
-- too: then the successor's claim finds nothing, and that is all).
SELECT pg_notify('django_jobs_listener', %(key)s || ':' || (
    EXISTS (SELECT FROM django_jobs_job
            WHERE state = 'pending' AND concurrency_key IS NULL AND run_after <= now()
              AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[])))
    OR EXISTS (SELECT FROM django_jobs_job
               WHERE state = 'pending' AND concurrency_key IS NOT NULL AND run_after <= now()
                 AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[])))
)::int)

-- name: stop_listening
-- Release the lock: the first worker in line gets it.
SELECT pg_advisory_unlock(current_setting('django_jobs.listener_key')::bigint)

-- name: sync_listen_connection
-- A round trip after the lock is granted: every notification the server held back during the
-- wait has been sent before this reply. (Like every statement of this connection, its text
-- names "listen": pg_stat_activity.query tells the LISTEN connections apart.)
SELECT 'listening' AS django_jobs_listener

-- name: listen_for_jobs
-- Enqueued work: each notification's payload names a queue that has some (store/db.py's
-- CHANNEL). The API's one LISTEN connection runs it too (api/waiting.py).
LISTEN django_jobs

-- name: listen_for_handover
-- A leaving listener's word to its successor (hand_over_listening).
LISTEN django_jobs_listener
