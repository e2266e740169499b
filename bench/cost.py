"""Cost per job: SQL statements and round trips per job, and CPU per 1,000 jobs.

django-jobs' worker is run in-process here (``Supervisor(...).run()``, what ``runjobworker``
runs) over ``jobs`` pre-enqueued no-op jobs, with libpq's protocol trace on its queue
connection (see :mod:`bench.tracing`). CPU is read from ``/proc`` for the supervisor (this
process), its executors and the PostgreSQL backend serving the queue connection, leaving
start-up out: from the first claim (supervisor, backend) or from the moment each executor
reported ready, to the shutdown of the executors, through the worker's observer hooks
(:mod:`django_jobs.worker.observer`). The floor worker is measured the same way, from its first
claim, for reference.

Run as ``python -m bench.cost`` it is the probe itself (a Django process on ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.core import (
    NOOP,
    Context,
    django_setup,
    emit,
    own_cpu_seconds,
    process_cpu_seconds,
    run_json,
)
from bench.systems import floor as floor_system
from bench.systems.base import System
from bench.tracing import count, start_trace

OUR_STATEMENTS: tuple[tuple[str, str | tuple[str, ...]], ...] = (
    # A busy worker sends a finish and its next claim as one message.
    ("finish+claim", ("django_jobs_finish(", "django_jobs_claim(")),
    ("claim", "django_jobs_claim("),
    ("finish", "django_jobs_finish("),
    ("heartbeat", "INSERT INTO django_jobs_worker"),
    ("startup recovery", "LEFT JOIN django_jobs_worker"),
    ("unregister", "DELETE FROM django_jobs_worker"),
)
FLOOR_STATEMENTS = (("claim", "SET state = 'running'"), ("finish", "SET state = 'done'"))


@dataclasses.dataclass(frozen=True)
class Setup:
    key: str
    label: str
    concurrency: int = 1
    log_level: str = "INFO"


SETUPS = (
    Setup("ours-1", "django-jobs, 1 slot", 1),
    Setup("ours-4", "django-jobs, 4 slots", 4),
    Setup("ours-4-quiet", "django-jobs, 4 slots, --log-level WARNING", 4, "WARNING"),
)


def run(
    ctx: Context,
    ours: System,
    floor: System,
    setups: Sequence[Setup],
    jobs: int,
    progress: Any = print,
) -> dict[str, list[dict[str, Any]]]:
    results = []
    for setup in setups:
        with ours.connect(ctx) as conn:
            ours.reset(conn)
        measured = run_json(
            [
                ctx.python,
                "-m",
                "bench.cost",
                "--jobs",
                str(jobs),
                "--concurrency",
                str(setup.concurrency),
                "--log-level",
                setup.log_level,
            ],
            ours.env(ctx),
        )
        results.append(_per_job(setup.key, setup.label, measured, jobs))
    with floor.connect(ctx) as conn:
        floor.reset(conn)
        floor.prefill(conn, NOOP, jobs)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "floor.trace"
        floor_run = run_json(floor.helper(ctx, "worker", "--trace", str(trace)), floor.env(ctx))
        counts = count(trace, FLOOR_STATEMENTS)
    floor_run.update(
        statements=counts.statements,
        round_trips=counts.round_trips,
        by_kind=counts.by_kind,
        supervisor_cpu_s=floor_run["worker_cpu_s"],
        executors_cpu_s=0.0,
    )
    results.append(_per_job("floor", "floor (raw psycopg), 1 slot", floor_run, jobs))
    with ours.connect(ctx) as conn:
        ours.reset(conn)
    statements = run_json(
        [ctx.python, "-m", "bench.cost", "--statements", "--jobs", str(jobs)], ours.env(ctx)
    )
    for row in statements:
        progress(
            f"  statements {row['label']:<42} claim {row['claim_rt_us']:5.0f} us"
            f" (database CPU {row['claim_db_cpu_us']:4.0f} us), finish {row['finish_rt_us']:5.0f}"
            f" us (database CPU {row['finish_db_cpu_us']:4.0f} us)"
        )
    with ours.connect(ctx) as conn:
        ours.reset(conn)
    steps = run_json(
        [ctx.python, "-m", "bench.cost", "--steps", "--jobs", str(jobs)], ours.env(ctx)
    )
    for row in steps:
        progress(
            f"  steps      {row['label']:<42} {row['rt_us']:5.0f} us"
            f" (database CPU {row['db_cpu_us']:4.0f} us)"
        )
    for row in results:
        progress(
            f"  cost       {row['label']:<42} {row['statements_per_job']:.2f} statements,"
            f" {row['round_trips_per_job']:.2f} round trips per job;"
            f" CPU per 1,000 jobs: worker {row['worker_cpu_ms_per_1000']:.0f} ms,"
            f" database {row['db_cpu_ms_per_1000']:.0f} ms"
        )
    return {"workers": results, "statements": statements, "steps": steps}


def _per_job(key: str, label: str, measured: dict[str, Any], jobs: int) -> dict[str, Any]:
    if measured["jobs"] != jobs:
        raise RuntimeError(f"{label}: ran {measured['jobs']} jobs, expected {jobs}")
    supervisor = measured["supervisor_cpu_s"]
    executors = measured["executors_cpu_s"]
    return {
        "setup": key,
        "label": label,
        "jobs": jobs,
        "statements_per_job": measured["statements"] / jobs,
        "round_trips_per_job": measured["round_trips"] / jobs,
        "by_kind_per_job": {kind: n / jobs for kind, n in measured["by_kind"].items()},
        "worker_cpu_ms_per_1000": 1e6 * (supervisor + executors) / jobs,
        "supervisor_cpu_ms_per_1000": 1e6 * supervisor / jobs,
        "executors_cpu_ms_per_1000": 1e6 * executors / jobs,
        "db_cpu_ms_per_1000": 1e6 * measured["db_cpu_s"] / jobs,
    }


# ------------------------------------------------------------------ the probe


def probe(jobs: int, concurrency: int, log_level: str) -> dict[str, Any]:
    """Run a burst worker in this process over ``jobs`` no-op jobs; count from its first
    claim to the shutdown of its executors, so start-up is left out."""
    from django.db import connection

    from bench.jobs import noop
    from django_jobs import logs
    from django_jobs.worker.observer import Observer
    from django_jobs.worker.supervisor import Supervisor

    noop.enqueue_many(((), {}) for _ in range(jobs))
    with connection.cursor() as cursor:  # as autovacuum would, and as the throughput runs do
        cursor.execute("ANALYZE django_jobs_job")
    logs.configure(log_level, "text")

    trace = Path(tempfile.mkdtemp()) / "queue.trace"
    clock: dict[str, float] = {}
    executors_ready: dict[int, float] = {}
    executors_cpu = 0.0

    class Meter(Observer):
        """Traces the queue connection; reads CPU from the first claim to the shutdown."""

        def connected(self, conn: Any) -> None:
            if "backend_pid" not in clock:
                start_trace(conn, trace)
                clock["backend_pid"] = conn.info.backend_pid

        def executor_ready(self, pid: int) -> None:
            executors_ready[pid] = process_cpu_seconds(pid)

        def claimed(self, job: Any) -> None:
            if "supervisor" not in clock:
                clock["supervisor"] = own_cpu_seconds()[0]
                clock["backend"] = process_cpu_seconds(int(clock["backend_pid"]))

        def stopping(self, executor_pids: list[int]) -> None:
            nonlocal executors_cpu
            clock["supervisor_end"] = own_cpu_seconds()[0]
            clock["backend_end"] = process_cpu_seconds(int(clock["backend_pid"]))
            for pid in executor_pids:
                if pid in executors_ready:
                    executors_cpu += process_cpu_seconds(pid) - executors_ready[pid]

    supervisor = Supervisor(
        concurrency=concurrency, burst=True, install_signals=False, name="cost", observer=Meter()
    )
    supervisor.run()
    counts = count(trace, OUR_STATEMENTS)
    return {
        "jobs": supervisor.stats.done,
        "statements": counts.statements,
        "round_trips": counts.round_trips,
        "by_kind": counts.by_kind,
        "supervisor_cpu_s": clock["supervisor_end"] - clock["supervisor"],
        "executors_cpu_s": executors_cpu,
        "db_cpu_s": clock["backend_end"] - clock["backend"],
    }


# One connection claiming and finishing jobs back to back, with the PostgreSQL backend's CPU
# read around each statement: django-jobs' claim and finish on the connection its worker opens
# (Django's connection parameters), the same on a plain psycopg connection (server-side binding,
# statements prepared after five runs), and the floor's two statements on django-jobs' table.
FLOOR_CLAIM_ON_OUR_TABLE = floor_system.CLAIM.replace("floor_job", "django_jobs_job")
FLOOR_FINISH_ON_OUR_TABLE = floor_system.FINISH.replace("floor_job", "django_jobs_job")


def statements_probe(jobs: int) -> list[dict[str, Any]]:
    import psycopg
    from django.db import connection

    from django_jobs import store
    from django_jobs.store.connection import connection_params

    def ours(conn: Any) -> tuple[Any, Any]:
        def claim() -> Any:
            return store.claim(conn.cursor(), "statements:1:x", None)

        def finish(job: Any) -> Any:
            return store.finish(conn.cursor(), job.lease, "done", result_json="null")

        return claim, finish

    def floor(conn: Any) -> tuple[Any, Any]:
        def claim() -> Any:
            return conn.execute(FLOOR_CLAIM_ON_OUR_TABLE, ["statements"]).fetchone()[0]

        def finish(job_id: Any) -> Any:
            return conn.execute(FLOOR_FINISH_ON_OUR_TABLE, [job_id])

        return claim, finish

    plain = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        plain.pop(key, None)
    setups = (
        ("django-jobs, on its worker's connection", connection_params("default", "s"), ours),
        ("django-jobs, on a plain psycopg connection", {**plain, "autocommit": True}, ours),
        ("floor statements, on django-jobs' table", {**plain, "autocommit": True}, floor),
    )
    rows = []
    for label, params, statements in setups:
        with psycopg.connect(**params) as conn:
            conn.execute("TRUNCATE django_jobs_job, django_jobs_attempt RESTART IDENTITY CASCADE")
            conn.execute(
                "INSERT INTO django_jobs_job (task, args, kwargs, max_attempts)"
                " SELECT 'bench.noop', '[]', '{}', 1 FROM generate_series(1, %s)",
                [jobs],
            )
            conn.execute("VACUUM ANALYZE django_jobs_job")
            claim, finish = statements(conn)
            pid = conn.info.backend_pid
            totals = [0.0, 0.0, 0.0, 0.0]
            for _ in range(jobs):
                cpu0, t0 = process_cpu_seconds(pid), time.perf_counter()
                job = claim()
                cpu1, t1 = process_cpu_seconds(pid), time.perf_counter()
                finish(job)
                cpu2, t2 = process_cpu_seconds(pid), time.perf_counter()
                for i, value in enumerate((t1 - t0, t2 - t1, cpu1 - cpu0, cpu2 - cpu1)):
                    totals[i] += value
        rows.append(
            {
                "label": label,
                **{
                    name: 1e6 * total / jobs
                    for name, total in zip(
                        ("claim_rt_us", "finish_rt_us", "claim_db_cpu_us", "finish_db_cpu_us"),
                        totals,
                        strict=True,
                    )
                },
            }
        )
    return rows


def steps_probe(jobs: int) -> list[dict[str, Any]]:
    """What a long job's checkpoint costs, per call, on a worker's connection: recording one step
    (a 100-byte result, durably), one cursor save as the worker writes it (with no progress),
    a live write of progress alone (what a job that saves no cursor costs anyway), the read a
    resumed run makes of its checkpoint, and ``is_owner()``. Round trip and the backend's CPU,
    each the mean over ``jobs`` running jobs, one call each."""
    import psycopg

    from django_jobs import store
    from django_jobs.progress import Progress
    from django_jobs.store.connection import connection_params

    result = '{"rows": 1000, "file": "' + "x" * 70 + '"}'
    with psycopg.connect(**connection_params("default", "s")) as conn:
        conn.execute(
            "TRUNCATE django_jobs_job, django_jobs_attempt, django_jobs_step RESTART IDENTITY"
            " CASCADE"
        )
        conn.execute(
            "INSERT INTO django_jobs_job (task, args, kwargs, max_attempts)"
            " SELECT 'bench.noop', '[]', '{}', 1 FROM generate_series(1, %s)",
            [jobs],
        )
        conn.execute("VACUUM ANALYZE django_jobs_job")
        leases = []
        for _ in range(jobs):
            claimed = store.claim(conn.cursor(), "steps:1:x", None)
            assert claimed is not None
            leases.append(claimed.lease)
        conn.execute("VACUUM ANALYZE django_jobs_job")
        calls = {
            "record a step": lambda lease: store.record_step(
                conn.cursor(), lease, "fetch", result, 0.5
            ),
            "save a cursor": lambda lease: store.record_live(
                conn.cursor(), lease, None, None, cursors={"page": "1234"}
            ),
            "progress alone": lambda lease: store.record_live(
                conn.cursor(), lease, Progress(lease.job_id, 1.0, 10.0), None
            ),
            "read the checkpoint": lambda lease: store.checkpoint(conn.cursor(), lease.job_id),
            "is_owner()": lambda lease: store.owns_lease(conn.cursor(), lease),
        }
        pid = conn.info.backend_pid
        rows = []
        for label, call in calls.items():
            wall = cpu = 0.0
            for lease in leases:
                cpu0, t0 = process_cpu_seconds(pid), time.perf_counter()
                call(lease)
                wall += time.perf_counter() - t0
                cpu += process_cpu_seconds(pid) - cpu0
            rows.append({"label": label, "rt_us": 1e6 * wall / jobs, "db_cpu_us": 1e6 * cpu / jobs})
        return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cost")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--statements", action="store_true", help="the per-statement probe")
    parser.add_argument("--steps", action="store_true", help="the steps and cursors probe")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    django_setup()
    if args.statements:
        emit(statements_probe(args.jobs))
    elif args.steps:
        emit(steps_probe(args.jobs))
    else:
        emit(probe(args.jobs, args.concurrency, args.log_level))


if __name__ == "__main__":
    main(sys.argv[1:])
