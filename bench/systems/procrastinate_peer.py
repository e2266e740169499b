"""Procrastinate, run with its own worker: one asyncio process whose ``concurrency`` is the
number of slots. The jobs are plain (sync) functions, as ours are; Procrastinate runs those in
threads. Its worker LISTENs for new jobs and claims one job per statement.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from bench.core import Context, Workload, emit
from bench.systems.base import System, helper_parser


class Procrastinate(System):
    key = "procrastinate"
    label = "Procrastinate"
    requires = "procrastinate"
    jobs_table = "procrastinate_jobs"
    tables = ("procrastinate_jobs", "procrastinate_events", "procrastinate_workers")
    finished_sql = (
        "SELECT extract(epoch FROM at) AS t FROM procrastinate_events WHERE type = 'succeeded'"
    )
    failed_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'"

    def worker_commands(
        self, ctx: Context, workload: Workload, slots: int, processes: int
    ) -> list[list[str]]:
        per_process = max(1, slots // processes)
        return [self.helper(ctx, "worker", "--concurrency", str(per_process))] * processes


# ------------------------------------------------------------------ the helper process


def make_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="bench.noop")
    def noop(**kwargs: Any) -> None:
        return None

    @app.task(name="bench.sleep")
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    app.bench_tasks = {"noop": noop, "sleep": sleep}  # type: ignore[attr-defined]
    return app


def enqueue_bench(app: Any, single: int, bulk: int) -> dict[str, float]:
    noop = app.bench_tasks["noop"]
    with app.open():
        start = time.perf_counter()
        for i in range(single):
            noop.defer(i=i)
        single_rate = single / (time.perf_counter() - start)

        start = time.perf_counter()
        noop.batch_defer(*({"i": i} for i in range(bulk)))
        bulk_rate = bulk / (time.perf_counter() - start)
    return {"single": single_rate, "bulk": bulk_rate}


async def work(app: Any, concurrency: int) -> None:
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=False)


def main(argv: list[str] | None = None) -> None:
    parser, sub = helper_parser("python -m bench.systems.procrastinate_peer")
    worker = sub.add_parser("worker")
    worker.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    app = make_app(os.environ["DATABASE_URL"])

    if args.command == "install":
        with app.open():
            app.schema_manager.apply_schema()
        emit({"installed": True})
    elif args.command == "enqueue-one":
        with app.open():
            if args.seconds:
                job_id = app.bench_tasks["sleep"].defer(seconds=args.seconds)
            else:
                job_id = app.bench_tasks["noop"].defer()
        emit({"enqueued": job_id})
    elif args.command == "worker":
        asyncio.run(work(app, args.concurrency))
    elif args.command == "enqueue-bench":
        emit(enqueue_bench(app, args.single, args.bulk))


if __name__ == "__main__":
    main(sys.argv[1:])
