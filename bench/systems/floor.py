"""The floor: the least work a SKIP LOCKED queue can do per job, in a bare psycopg loop.

Each worker process owns one connection in autocommit mode and, per job, runs one short claim
transaction (``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING``),
runs the job inline, and one short finish transaction. No attempts table, no fencing, no
heartbeats, no logging, no executor process: whatever django-jobs costs above this is its
overhead. A worker with N slots is N such processes.

For the enqueue benchmark the floor writes raw rows into django-jobs' own table (in the
``ours`` database), so the comparison isolates the library's overhead from the schema's.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psycopg

from bench.core import (
    Context,
    Workload,
    emit,
    own_cpu_seconds,
    process_cpu_seconds,
    python_env,
    run_json,
)
from bench.systems.base import System, helper_parser

SCHEMA = """
CREATE TABLE floor_job (
    id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'pending',
    priority smallint NOT NULL DEFAULT 0,
    run_after timestamptz NOT NULL DEFAULT now(),
    args jsonb NOT NULL DEFAULT '[]',
    worker_id text,
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX floor_job_claim_idx ON floor_job (priority DESC, run_after, id)
    WHERE state = 'pending';
"""

CLAIM = """
UPDATE floor_job SET state = 'running', worker_id = %s, started_at = now()
WHERE id = (
    SELECT id FROM floor_job
    WHERE state = 'pending' AND run_after <= now()
    ORDER BY priority DESC, run_after, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING id, args
"""

FINISH = "UPDATE floor_job SET state = 'done', finished_at = now() WHERE id = %s"

# The enqueue floor: the same columns django-jobs writes, as raw statements.
_COLUMNS = "task, queue, priority, state, args, kwargs, max_attempts"
INSERT_ONE = (
    f"INSERT INTO django_jobs_job ({_COLUMNS})"
    " VALUES (%s, 'default', 0, 'pending', %s::jsonb, '{}', 1) RETURNING id"
)
COPY = f"COPY django_jobs_job ({_COLUMNS}) FROM STDIN"


class Floor(System):
    key = "floor"
    label = "floor (raw psycopg)"
    jobs_table = "floor_job"
    tables = ("floor_job",)
    finished_sql = "SELECT extract(epoch FROM finished_at) AS t FROM floor_job WHERE state = 'done'"
    failed_sql = "SELECT 0"

    def worker_commands(
        self, ctx: Context, workload: Workload, slots: int, processes: int
    ) -> list[list[str]]:
        # One process per slot, whatever ``processes`` says: that is the floor's design.
        return [self.helper(ctx, "worker") for _ in range(slots)]

    def enqueue_bench(self, ctx: Context, single: int, bulk: int) -> dict[str, float | None]:
        ours = ctx.server.database("ours")
        with ctx.server.connect(ours) as conn:
            conn.execute("TRUNCATE django_jobs_job RESTART IDENTITY CASCADE")
        return run_json(
            self.helper(ctx, "enqueue-bench", "--single", str(single), "--bulk", str(bulk)),
            python_env(DATABASE_URL=ctx.server.url_for(ours)),
        )


# ------------------------------------------------------------------ the helper process


def work(dsn: str, trace: str | None = None) -> dict[str, Any]:
    """Claim, run and finish jobs until none is ready; report what it cost."""
    conn = psycopg.connect(dsn, autocommit=True)
    if trace:
        from bench.tracing import start_trace

        start_trace(conn, trace)
    backend_before = process_cpu_seconds(conn.info.backend_pid)
    cpu_before, _ = own_cpu_seconds()
    worker_id = f"floor-{os.getpid()}"
    jobs = 0
    while True:
        row = conn.execute(CLAIM, [worker_id]).fetchone()
        if row is None:
            break
        job_id, args = row
        if args:
            time.sleep(args[0])
        conn.execute(FINISH, [job_id])
        jobs += 1
    cpu_after, _ = own_cpu_seconds()
    backend_after = process_cpu_seconds(conn.info.backend_pid)
    conn.close()
    return {
        "jobs": jobs,
        "worker_cpu_s": cpu_after - cpu_before,
        "db_cpu_s": backend_after - backend_before,
    }


def enqueue_bench(dsn: str, single: int, bulk: int) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(single):
            conn.execute(INSERT_ONE, ["bench.noop", f"[{i}]"])
        single_rate = single / (time.perf_counter() - start)

        rows = [("bench.noop", "default", 0, "pending", f"[{i}]", "{}", 1) for i in range(bulk)]
        start = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor, cursor.copy(COPY) as copy:
            for row in rows:
                copy.write_row(row)
        copy_rate = bulk / (time.perf_counter() - start)

        start = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO django_jobs_job ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
        executemany_rate = bulk / (time.perf_counter() - start)
    return {"single": single_rate, "bulk": copy_rate, "bulk_executemany": executemany_rate}


def main(argv: list[str] | None = None) -> None:
    parser, sub = helper_parser("python -m bench.systems.floor")
    worker = sub.add_parser("worker")
    worker.add_argument("--trace", default=None, help="write a libpq protocol trace here")
    args = parser.parse_args(argv)
    dsn = os.environ["DATABASE_URL"]

    if args.command == "install":
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        emit({"installed": True})
    elif args.command == "enqueue-one":
        with psycopg.connect(dsn, autocommit=True) as conn:
            payload = "[]" if not args.seconds else f"[{args.seconds}]"
            conn.execute("INSERT INTO floor_job (args) VALUES (%s::jsonb)", [payload])
        emit({"enqueued": 1})
    elif args.command == "worker":
        emit(work(dsn, args.trace))
    elif args.command == "enqueue-bench":
        emit(enqueue_bench(dsn, args.single, args.bulk))


if __name__ == "__main__":
    main(sys.argv[1:])
