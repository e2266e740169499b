"""PgQueuer, run the way its own drain benchmark runs it: one asyncio process with one
``PgQueuer`` on one psycopg connection, claiming jobs in batches (``batch_size=10``, its
default). PgQueuer only runs ``async`` entrypoints: the no-op returns at once, and the 10 ms
job runs ``time.sleep`` through ``asyncio.to_thread``, as PgQueuer asks of blocking code. The
slots are the threads of that pool, so no more than that many blocking jobs run at once.
(The entrypoints' own ``concurrency_limit`` is not used: it makes the worker wait a poll
interval each time the limit is reached, which would measure the poll interval, not PgQueuer.)
Everything else is PgQueuer's default, as in its own drain benchmark.

PgQueuer is measured on the no-op jobs only. On the 10 ms jobs its drain loop, once it holds
as many picked jobs as it will take, waits for a wake-up (about a second here) before it picks
more, whatever its in-flight cap, so those rows would measure that wait, not its queue.

Finished jobs are deleted from its queue table; their finish times are read from its log table
(written in batches, so they are a little late, which does not change a steady rate). Log
aggregation is turned off so that the log rows stay.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from bench.core import Context, Workload, emit
from bench.systems.base import System, helper_parser

BATCH_SIZE = 10


class PgQueuer(System):
    key = "pgqueuer"
    label = "PgQueuer"
    requires = "pgqueuer"
    jobs_table = "pgqueuer"
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
    finished_sql = (
        "SELECT extract(epoch FROM created) AS t FROM pgqueuer_log WHERE status = 'successful'"
    )
    failed_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'exception'"

    def worker_commands(
        self, ctx: Context, workload: Workload, slots: int, processes: int
    ) -> list[list[str]]:
        per_process = max(1, slots // processes)
        return [self.helper(ctx, "worker", "--slots", str(per_process))] * processes


# ------------------------------------------------------------------ the helper process


def sync_queries(dsn: str) -> Any:
    import psycopg
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    return SyncQueries(SyncPsycopgDriver(psycopg.connect(dsn, autocommit=True)))


async def install(dsn: str) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await Queries(PsycopgDriver(conn)).install()
    await conn.close()


async def work(dsn: str, slots: int) -> None:
    import psycopg
    from pgqueuer import PgQueuer as Queue
    from pgqueuer import PsycopgDriver
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    queue = Queue(PsycopgDriver(conn))
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=slots))

    @queue.entrypoint("bench.noop", concurrency_limit=0)
    async def noop(job: Job) -> None:
        return None

    @queue.entrypoint("bench.sleep", concurrency_limit=0)
    async def sleep(job: Job) -> None:
        await asyncio.to_thread(time.sleep, float(job.payload or b"0"))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, queue.shutdown.set)
    await queue.run(
        batch_size=BATCH_SIZE,
        mode=QueueExecutionMode.drain,
        log_aggregation_interval=timedelta(0),
    )
    await conn.close()


def enqueue_bench(dsn: str, single: int, bulk: int) -> dict[str, float]:
    queries = sync_queries(dsn)
    start = time.perf_counter()
    for i in range(single):
        queries.enqueue("bench.noop", str(i).encode())
    single_rate = single / (time.perf_counter() - start)

    start = time.perf_counter()
    queries.enqueue(["bench.noop"] * bulk, [str(i).encode() for i in range(bulk)], [0] * bulk)
    bulk_rate = bulk / (time.perf_counter() - start)
    return {"single": single_rate, "bulk": bulk_rate}


def main(argv: list[str] | None = None) -> None:
    parser, sub = helper_parser("python -m bench.systems.pgqueuer_peer")
    worker = sub.add_parser("worker")
    worker.add_argument("--slots", type=int, default=1)
    args = parser.parse_args(argv)
    dsn = os.environ["DATABASE_URL"]

    if args.command == "install":
        asyncio.run(install(dsn))
        emit({"installed": True})
    elif args.command == "enqueue-one":
        queries = sync_queries(dsn)
        if args.seconds:
            ids = queries.enqueue("bench.sleep", str(args.seconds).encode())
        else:
            ids = queries.enqueue("bench.noop", None)
        emit({"enqueued": [int(i) for i in ids]})
    elif args.command == "worker":
        asyncio.run(work(dsn, args.slots))
    elif args.command == "enqueue-bench":
        emit(enqueue_bench(dsn, args.single, args.bulk))


if __name__ == "__main__":
    main(sys.argv[1:])
