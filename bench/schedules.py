#!/usr/bin/env python3
"""What periodic jobs cost the database: statements per scheduler tick, and per fired job.

    python bench/schedules.py                     # database bench_schedules on the local server
    python bench/schedules.py --schedulers 1,4,8 --schedules 10,100,1000

For each N schedulers x M schedules it makes M yearly schedules, then measures two moments,
each a pass of every scheduler at once (threads, one connection each, as workers have): an idle
tick (nothing due), and a firing tick (all M made due by hand: each enqueues once). Yearly, so
that a pass that runs past a minute boundary fires no second, genuine tick. A
statement is one call of ``django_jobs.store.db.execute`` (one round trip; counted in-process) plus
the BEGIN and COMMIT of each transaction. Run it with the project's virtualenv
(``.venv/bin/python``); the database is created and migrated if needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_schedules"


class Counting:
    """Counts statements per thread by wrapping ``db.execute`` and ``db.transaction``."""

    def __init__(self) -> None:
        from django_jobs.store import db

        self.counts: Counter[int] = Counter()
        self.lock = threading.Lock()
        execute, transaction = db.execute, db.transaction

        def counted_execute(*args: Any, **kwargs: Any) -> Any:
            self.add(1)
            return execute(*args, **kwargs)

        def counted_transaction(*args: Any, **kwargs: Any) -> Any:
            self.add(2)  # BEGIN and COMMIT (or ROLLBACK)
            return transaction(*args, **kwargs)

        db.execute, db.transaction = counted_execute, counted_transaction

    def add(self, n: int) -> None:
        with self.lock:
            self.counts[threading.get_ident()] += n

    def take(self) -> int:
        with self.lock:
            total = sum(self.counts.values())
            self.counts.clear()
        return total


def one_tick(conns: list[Any], tasks: list[str]) -> tuple[int, float]:
    """Every scheduler's pass at once: (jobs fired, seconds)."""
    from django_jobs.schedules import ticks

    barrier = threading.Barrier(len(conns))
    fired: list[int] = []

    def run(conn: Any) -> None:
        barrier.wait()
        # Passes until nothing is due, as a worker's loop does: one pass handles at most
        # ticks.PASS_LIMIT schedules.
        while True:
            done = ticks.fire_due(conn.cursor(), tasks)
            fired.append(done.fired)
            if done.seconds_until_due is None or done.seconds_until_due > 0:
                return

    threads = [threading.Thread(target=run, args=(conn,)) for conn in conns]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(fired), time.perf_counter() - started


def measure(url: str, schedulers: int, schedules: int, counting: Counting) -> dict[str, Any]:
    import psycopg

    from django_jobs.registry import registry

    tasks = registry.names()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "TRUNCATE django_jobs_schedule_tick, django_jobs_schedule, django_jobs_job CASCADE"
        )
        admin.execute(
            "INSERT INTO django_jobs_schedule (name, task, cron, timezone, args, kwargs, queue, "
            "catch_up, overlap, paused, paused_by, source, next_run_at, last_outcome, "
            "created_at, updated_at) SELECT 'bench-' || i, 'tests.noop', '0 0 1 1 *', 'UTC', "
            "'[]', '{}', '', 'skip', 'allow', false, '', 'admin', "
            "now() + interval '1 hour', '', now(), now() "
            "FROM generate_series(1, %s) i",
            [schedules],
        )
        admin.execute("ANALYZE django_jobs_schedule")
        conns = [psycopg.connect(url, autocommit=True) for _ in range(schedulers)]
        try:
            counting.take()
            idle_fired, _ = one_tick(conns, tasks)
            idle = counting.take()
            admin.execute(
                "UPDATE django_jobs_schedule SET next_run_at = date_trunc('minute', now())"
            )
            fired, seconds = one_tick(conns, tasks)
            firing = counting.take()
            jobs = admin.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0]
            ticks = admin.execute("SELECT count(*) FROM django_jobs_schedule_tick").fetchone()[0]
        finally:
            for conn in conns:
                conn.close()
    assert idle_fired == 0 and fired == jobs == ticks == schedules, (fired, jobs, ticks)
    return {
        "schedulers": schedulers,
        "schedules": schedules,
        "idle_per_scheduler": idle / schedulers,
        "firing_total": firing,
        "per_job": firing / schedules,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--schedulers", default="1,2,4", help="comma-separated N")
    parser.add_argument("--schedules", default="10,100", help="comma-separated M")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from bench.core import ensure_migrated

    ensure_migrated(args.database_url, "testproject.settings")
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    counting = Counting()
    print(
        "| schedulers | schedules | statements per idle tick, per scheduler "
        "| statements for the firing tick | per fired job | firing tick, s |"
    )
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.schedulers.split(",")):
        for m in (int(x) for x in args.schedules.split(",")):
            r = measure(args.database_url, n, m, counting)
            print(
                f"| {n} | {m} | {r['idle_per_scheduler']:.0f} | {r['firing_total']} "
                f"| {r['per_job']:.2f} | {r['seconds']:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
