"""A month of realistic job history, generated in SQL: for plan tests and the cost benchmarks.

Finished jobs (mostly done, some error and cancelled) with their attempts, a live edge of
pending, scheduled, running and waiting jobs, workers alive and dead, parents and dependencies.
Every value derives from the row number, so the data is the same on every run.
"""

from __future__ import annotations

from typing import Any

TASKS = [
    ("reports.build_report", "reports", 240),
    ("reports.render_pdf", "reports", 45),
    ("imports.load_csv", "imports", 600),
    ("imports.geocode", "imports", 20),
    ("ml.train_model", "ml", 1800),
    ("ml.score_batch", "ml", 300),
    ("mail.send_digest", "default", 5),
    ("mail.bounce_report", "default", 30),
    ("billing.invoice_month", "default", 90),
    ("search.reindex", "default", 900),
    ("media.transcode", "media", 420),
    ("media.thumbnail", "media", 8),
]

# A month of history ending now: finished jobs (mostly done, some error and cancelled) with their
# attempts, then a live edge of pending, scheduled, running and waiting jobs; workers alive and
# dead; parents and dependencies. Every value derives from the row number, so runs are
# repeatable. Placeholders: %(finished)s jobs, %(pending)s, %(waiting)s, %(running)s.
FILL = [
    """
    CREATE TEMP TABLE bench_tasks (n int PRIMARY KEY, task text, queue text, base float8)
    """,
    "INSERT INTO bench_tasks VALUES {tasks}",
    # Finished jobs: created evenly over 30 days up to 5 minutes ago. 2.5% end in error after
    # all 3 attempts, 1.5% are cancelled, 8% of the done ones needed a second attempt.
    """
    INSERT INTO django_jobs_job (id, task, queue, priority, state, attempt, max_attempts,
                                 timeout, run_after, worker_id, created_at, started_at,
                                 finished_at, error, parent_id)
    SELECT %(base)s + g, t.task, t.queue, (g %% 5) * 10 - 20, s.state,
           CASE s.state WHEN 'error' THEN 3 WHEN 'cancelled' THEN g %% 2
                        ELSE 1 + (g %% 100 < 8)::int END,
           3, CASE WHEN g %% 3 = 0 THEN (t.base * 6)::int END,
           c.created, 'worker-' || (g %% 13) || ':1:abc', c.created,
           c.created + make_interval(secs => 1 + g %% 7),
           c.created + make_interval(secs => 1 + g %% 7 + d.secs),
           CASE s.state WHEN 'error' THEN 'ValueError: bad input row ' || g ELSE '' END,
           CASE WHEN g %% 20 = 0 AND g > 50 THEN %(base)s + g - 1 - g %% 37 END
    FROM generate_series(1::bigint, %(finished)s) g
    JOIN bench_tasks t ON t.n = g %% {task_count}
    CROSS JOIN LATERAL (
        SELECT now() - interval '5 minutes'
               - make_interval(secs => 30 * 86400 * (1 - g::float8 / %(finished)s)) AS created
    ) c
    CROSS JOIN LATERAL (
        SELECT t.base * (0.3 + ((g * 7919) %% 1000) / 1000.0
                         + CASE WHEN g %% 97 = 0 THEN 4 ELSE 0 END) AS secs
    ) d
    CROSS JOIN LATERAL (
        SELECT CASE WHEN g %% 1000 < 25 THEN 'error' WHEN g %% 1000 < 40 THEN 'cancelled'
                    ELSE 'done' END AS state
    ) s
    """,
    "SELECT setval(pg_get_serial_sequence('django_jobs_job', 'id'), %(base)s + %(finished)s)",
    # The live edge: pending jobs that became ready over the last hour (10% scheduled up to an
    # hour ahead), some after failed attempts; running jobs; waiting jobs.
    """
    INSERT INTO django_jobs_job (task, queue, priority, state, attempt, max_attempts, run_after,
                                 created_at, parent_id)
    SELECT t.task, t.queue, (g %% 5) * 10 - 20, 'pending', (g %% 50 = 0)::int, 3,
           CASE WHEN g %% 10 = 0 THEN now() + make_interval(secs => g %% 3600)
                ELSE now() - make_interval(secs => (g * 7) %% 3600) END,
           now() - make_interval(secs => (g * 7) %% 3600 + 5),
           CASE WHEN g %% 25 = 0 THEN %(base)s + (g * 7919) %% %(finished)s + 1 END
    FROM generate_series(1::bigint, %(pending)s) g
    JOIN bench_tasks t ON t.n = g %% {task_count}
    """,
    """
    INSERT INTO django_jobs_job (task, queue, state, attempt, max_attempts, timeout, run_after,
                                 created_at, started_at, worker_id)
    SELECT t.task, t.queue, 'running', 1, 3, CASE WHEN g %% 10 = 0 THEN 60 END,
           now() - interval '20 minutes', now() - interval '20 minutes',
           now() - make_interval(secs => CASE WHEN g %% 10 = 0 THEN 900 ELSE g * 7 %% 600 END),
           'worker-' || (g %% 13) || ':1:abc'
    FROM generate_series(1, %(running)s) g
    JOIN bench_tasks t ON t.n = g %% {task_count}
    """,
    """
    INSERT INTO django_jobs_job (task, queue, state, max_attempts, run_after, created_at)
    SELECT t.task, t.queue, 'waiting', 3, now() - make_interval(secs => g %% 1800),
           now() - make_interval(secs => g %% 1800)
    FROM generate_series(1, %(waiting)s) g
    JOIN bench_tasks t ON t.n = g %% {task_count}
    """,
    # Waiting jobs wait for a pending one; 1% of finished jobs had a dependency too.
    """
    INSERT INTO django_jobs_dependency (job_id, depends_on_id)
    SELECT w.id, p.id
    FROM (SELECT id, row_number() OVER (ORDER BY id) AS n
          FROM django_jobs_job WHERE state = 'waiting') w
    JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n
          FROM django_jobs_job WHERE state = 'pending') p ON p.n = w.n
    """,
    """
    INSERT INTO django_jobs_dependency (job_id, depends_on_id)
    SELECT %(base)s + g, %(base)s + g - 1 - g %% 11
    FROM generate_series(100, %(finished)s, 100) g
    """,
    # Attempts: one row per claim. Earlier attempts of a job failed (error, then now and then
    # a crash, a timeout or a lost worker), a minute or so apart.
    """
    INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, finished_at, outcome,
                                     error, traceback)
    SELECT j.id, n.n, coalesce(j.worker_id, 'worker-' || (j.id %% 13) || ':1:abc'),
           b.at - make_interval(secs => 90 * (j.attempt - n.n)),
           CASE WHEN n.n = j.attempt AND j.state = 'running' THEN NULL
                WHEN n.n = j.attempt AND j.state <> 'pending' THEN j.finished_at
                ELSE b.at - make_interval(secs => 90 * (j.attempt - n.n) - 20) END,
           CASE WHEN n.n = j.attempt AND j.state IN ('done', 'cancelled', 'running')
                THEN j.state
                ELSE (ARRAY['error', 'error', 'error', 'crashed', 'timeout', 'lost'])[
                          1 + (j.id + n.n) %% 6] END,
           CASE WHEN n.n = j.attempt AND j.state IN ('done', 'cancelled', 'running') THEN ''
                ELSE 'ValueError: bad input row ' || j.id END,
           ''
    FROM django_jobs_job j
    CROSS JOIN LATERAL generate_series(1, j.attempt) n(n)
    CROSS JOIN LATERAL (
        SELECT coalesce(
            j.started_at,
            least(j.run_after, now() - make_interval(secs => j.id %% 3600))
            - interval '2 minutes'
        ) AS at
    ) b
    WHERE j.attempt > 0
    """,
    # Workers: ten alive, three silent for ten minutes.
    """
    INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency, started_at,
                                    last_seen_at)
    SELECT 'worker-' || g || ':1:abc', 'worker-' || g, 'node-' || (g %% 4), 1000 + g,
           CASE WHEN g %% 3 = 0 THEN '["reports", "default"]' ELSE '[]' END::jsonb, 4,
           now() - interval '2 days',
           now() - CASE WHEN g >= 10 THEN interval '10 minutes'
                        ELSE make_interval(secs => g) END
    FROM generate_series(0, 12) g
    """,
]


def fill_history(
    cursor: Any, *, finished: int, pending: int = 20_000, running: int = 40, waiting: int = 3_000
) -> None:
    """Insert a month of job history ending now, plus a live edge of unfinished jobs."""
    tasks = ", ".join(
        f"({i}, '{name}', '{queue}', {base})" for i, (name, queue, base) in enumerate(TASKS)
    )
    cursor.execute("SELECT coalesce(max(id), 0) FROM django_jobs_job")
    base = max(cursor.fetchone()[0], _next_id(cursor))
    params = {
        "base": base,
        "finished": finished,
        "pending": pending,
        "running": running,
        "waiting": waiting,
    }
    for statement in FILL:
        sql = statement.format(tasks=tasks, task_count=len(TASKS))
        cursor.execute(sql, params)
    cursor.execute("DROP TABLE bench_tasks")


def _next_id(cursor: Any) -> int:
    # The sequence may be ahead of the table (deleted rows); never reuse an id it handed out.
    cursor.execute(
        "SELECT last_value FROM pg_sequences "
        "WHERE sequencename = 'django_jobs_job_id_seq' AND last_value IS NOT NULL"
    )
    row = cursor.fetchone()
    return row[0] if row else 0
