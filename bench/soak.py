#!/usr/bin/env python3
"""Soak: minutes of steady queue load, with a long-open transaction in the middle third.

    .venv/bin/python bench/soak.py --minutes 6
    .venv/bin/python bench/soak.py --minutes 10 --rate 300 --workers 6 --output soak.json

A producer enqueues ``--rate`` jobs a second; ``--workers`` threads claim and finish them with
the real statements of ``django_jobs.store`` (one connection each, autocommit), 3% of them
failing and being retried; a heartbeat thread beats for every worker once a second. During the
middle third of the run another session holds a transaction open (idle, REPEATABLE READ), as a
forgotten ``psql`` or a long report would: vacuum cannot remove the row versions it might still
see, so dead index entries pile up in front of every claim.

It reports claim latency (p50, p99, max) before, during and after that transaction, dead
tuples, table and index sizes, autovacuum runs, and the share of updates that were HOT. The
database (``--database-url``, default ``ops_soak`` on the local server) is created if missing
and migrated; its job tables are emptied first and seeded with ``--history`` finished jobs.
See bench/SOAK.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/ops_soak"
TABLES = ("django_jobs_job", "django_jobs_attempt", "django_jobs_worker")
PHASES = ("before", "during", "after")


@dataclasses.dataclass
class Sample:
    at: float
    phase: str
    seconds: float
    found: bool


@dataclasses.dataclass
class Run:
    """Shared state of one soak run; the threads append, the main thread reads."""

    started: float
    minutes: float
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    claims: list[Sample] = dataclasses.field(default_factory=list)
    enqueued: int = 0
    finished: int = 0
    failed: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    vacuum: str = "autovacuum"
    table_samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def phase(self, at: float | None = None) -> str:
        third = self.minutes * 60 / 3
        elapsed = (time.monotonic() if at is None else at) - self.started
        return PHASES[min(2, int(elapsed // third))]


def connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, application_name="django-jobs-soak")


def producer(url: str, run: Run, rate: float) -> None:
    """Enqueue ``rate`` jobs a second, ten times a second, over three queues."""
    with connect(url) as conn:
        tick = 0
        next_at = time.monotonic()
        owed = 0.0
        while not run.stop.is_set():
            owed += rate / 10
            count = int(owed)
            owed -= count
            if count:
                conn.execute(
                    """
                    INSERT INTO django_jobs_job (task, queue, priority, args)
                    SELECT 'tests.noop', (ARRAY['default', 'reports', 'imports'])[1 + g %% 3],
                           (g %% 3) * 10, jsonb_build_array(g)
                    FROM generate_series(%s::bigint, %s::bigint) g
                    """,
                    [tick, tick + count - 1],
                )
                run.enqueued += count
                tick += count
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))


def worker(url: str, run: Run, worker_id: str, work_seconds: float) -> None:
    """Claim, "run" for ``work_seconds``, finish; 3% of attempts fail and are retried."""
    from django_jobs import store

    rng = random.Random(worker_id)
    with connect(url) as conn, conn.cursor() as cursor:
        while not run.stop.is_set():
            try:
                begun = time.monotonic()
                job = store.claim(cursor, worker_id, None)
                took = time.monotonic() - begun
                run.claims.append(Sample(begun, run.phase(begun), took, job is not None))
                if job is None:
                    time.sleep(0.05)
                    continue
                time.sleep(work_seconds * rng.uniform(0.5, 1.5))
                if rng.random() < 0.03:
                    store.finish(cursor, job.lease, "error", error="soak failure", retry_delay=0.5)
                    with run.lock:
                        run.failed += 1
                else:
                    store.finish(cursor, job.lease, "done", result_json="null")
                    with run.lock:
                        run.finished += 1
            except Exception as exc:  # keep going; report at the end
                run.errors.append(f"{worker_id}: {type(exc).__name__}: {exc}")
                time.sleep(0.5)


def heartbeats(url: str, run: Run, worker_ids: list[str]) -> None:
    """One heartbeat a second per worker: the worker table's steady HOT updates."""
    from django_jobs import store

    with connect(url) as conn, conn.cursor() as cursor:
        while not run.stop.wait(1.0):
            for worker_id in worker_ids:
                info = store.WorkerInfo(worker_id, "soak", "soak-host", os.getpid(), [], 1)
                store.heartbeat(cursor, info, [])


def long_transaction(url: str, run: Run) -> None:
    """Hold a snapshot open for the middle third of the run."""
    third = run.minutes * 60 / 3
    if run.stop.wait(max(0.0, run.started + third - time.monotonic())):
        return
    with connect(url) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM django_jobs_job WHERE id < 100")
        run.stop.wait(max(0.0, run.started + 2 * third - time.monotonic()))
        conn.execute("COMMIT")


def vacuumer(url: str, run: Run, every: float) -> None:
    """Stand in for autovacuum where the server runs without it: VACUUM the three tables every
    ``every`` seconds, as autovacuum would with ``autovacuum_naptime = every``."""
    with connect(url) as conn:
        while not run.stop.wait(every):
            for table in TABLES:
                conn.execute(f"VACUUM {table}")


TABLE_STATS = """
SELECT relname, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd,
       autovacuum_count + vacuum_count,
       pg_relation_size(relid) AS table_bytes, pg_indexes_size(relid) AS index_bytes
FROM pg_stat_user_tables WHERE relname = ANY(%s)
"""


def sampler(url: str, run: Run, every: float = 5.0) -> None:
    with connect(url) as conn:
        while True:
            rows = conn.execute(TABLE_STATS, [list(TABLES)]).fetchall()
            now = time.monotonic()
            run.table_samples.append(
                {
                    "at": round(now - run.started, 1),
                    "phase": run.phase(now),
                    "tables": {
                        r[0]: dict(
                            zip(
                                [
                                    "live",
                                    "dead",
                                    "upd",
                                    "hot_upd",
                                    "vacuums",
                                    "table_bytes",
                                    "index_bytes",
                                ],
                                r[1:],
                                strict=True,
                            )
                        )
                        for r in rows
                    },
                }
            )
            if run.stop.wait(every):
                return


def index_sizes(url: str) -> dict[str, int]:
    with connect(url) as conn:
        rows = conn.execute(
            """
            SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
            WHERE relname = ANY(%s) ORDER BY indexrelname
            """,
            [list(TABLES)],
        ).fetchall()
    return dict(rows)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def prepare(url: str, history: int) -> None:
    """Create and migrate the database, empty the job tables, seed finished history."""
    sys.path.insert(0, str(ROOT))
    from bench.core import ensure_migrated
    from support.history import fill_history

    ensure_migrated(url, "testproject.settings")

    with connect(url) as conn, conn.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_jobs_attempt, django_jobs_dependency, django_jobs_worker, "
            "django_jobs_step, django_jobs_job RESTART IDENTITY"
        )
        if history:
            fill_history(cursor, finished=history, pending=0, running=0, waiting=0)
            cursor.execute("DELETE FROM django_jobs_worker")
        cursor.execute("VACUUM ANALYZE django_jobs_job")
        cursor.execute("VACUUM ANALYZE django_jobs_attempt")
        cursor.execute("VACUUM ANALYZE django_jobs_worker")
        cursor.execute("SELECT pg_stat_reset()")


def report(run: Run, sizes_before: dict[str, int], sizes_after: dict[str, int]) -> dict[str, Any]:
    phases = {}
    for phase in PHASES:
        samples = [s for s in run.claims if s.phase == phase]
        found = [s.seconds * 1000 for s in samples if s.found]
        every = [s.seconds * 1000 for s in samples]
        tables = [t for t in run.table_samples if t["phase"] == phase]
        phases[phase] = {
            "claims": len(found),
            "empty_claims": len(every) - len(found),
            "claim_ms_p50": round(percentile(found, 0.5), 2),
            "claim_ms_p99": round(percentile(found, 0.99), 2),
            "claim_ms_max": round(max(found, default=0.0), 2),
            "any_claim_ms_p50": round(percentile(every, 0.5), 2),
            "any_claim_ms_p99": round(percentile(every, 0.99), 2),
            "max_dead_tuples": {
                table: max((t["tables"].get(table, {}).get("dead", 0) for t in tables), default=0)
                for table in TABLES
            },
        }
    last = run.table_samples[-1]["tables"] if run.table_samples else {}
    return {
        "minutes": run.minutes,
        "vacuum": run.vacuum,
        "enqueued": run.enqueued,
        "finished": run.finished,
        "failed_attempts": run.failed,
        "phases": phases,
        "tables": {
            table: {
                "live": stats["live"],
                "dead": stats["dead"],
                "table_mb": round(stats["table_bytes"] / 2**20, 1),
                "indexes_mb": round(stats["index_bytes"] / 2**20, 1),
                "updates": stats["upd"],
                "hot_share": round(stats["hot_upd"] / stats["upd"], 3) if stats["upd"] else None,
                "vacuums": stats["vacuums"],
            }
            for table, stats in last.items()
        },
        "index_mb": {
            name: [round(sizes_before.get(name, 0) / 2**20, 2), round(size / 2**20, 2)]
            for name, size in sizes_after.items()
        },
        "dead_tuples_timeline": [
            [t["at"], t["phase"], t["tables"].get("django_jobs_job", {}).get("dead", 0)]
            for t in run.table_samples
        ],
        "errors": run.errors[:20],
    }


def print_report(result: dict[str, Any]) -> None:
    print(
        f"\nsoak: {result['minutes']} min, {result['enqueued']} enqueued, "
        f"{result['finished']} done, {result['failed_attempts']} failed attempts (retried); "
        f"vacuum: {result['vacuum']}\n"
    )
    print("| phase | claims | claim p50 ms | claim p99 ms | max ms | max dead tuples (job) |")
    print("|---|---:|---:|---:|---:|---:|")
    for phase, p in result["phases"].items():
        print(
            f"| {phase} | {p['claims']} | {p['claim_ms_p50']} | {p['claim_ms_p99']} | "
            f"{p['claim_ms_max']} | {p['max_dead_tuples']['django_jobs_job']} |"
        )
    print("\n| table | live | dead | table MB | indexes MB | updates | HOT share | vacuums |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for table, t in result["tables"].items():
        hot = "" if t["hot_share"] is None else f"{t['hot_share']:.1%}"
        print(
            f"| {table} | {t['live']} | {t['dead']} | {t['table_mb']} | {t['indexes_mb']} | "
            f"{t['updates']} | {hot} | {t['vacuums']} |"
        )
    print("\n| index | MB before | MB after |")
    print("|---|---:|---:|")
    for name, (before, after) in result["index_mb"].items():
        print(f"| {name} | {before} | {after} |")
    if result["errors"]:
        print("\nerrors:", *result["errors"], sep="\n  ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="length of the run (6)")
    parser.add_argument("--rate", type=float, default=150.0, help="jobs enqueued a second (150)")
    parser.add_argument("--workers", type=int, default=4, help="claiming threads (4)")
    parser.add_argument(
        "--work-ms", type=float, default=10.0, help="mean simulated run time of a job (10 ms)"
    )
    parser.add_argument(
        "--history", type=int, default=200_000, help="finished jobs to seed (200000)"
    )
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="if the server's autovacuum is off, VACUUM the tables every SECONDS instead "
        "(default 60, autovacuum's naptime; 0: never)",
    )
    parser.add_argument("--database-url", default=os.environ.get("SOAK_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--output", type=Path, help="also write the figures here, as JSON")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("DATABASE_URL", args.database_url)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    print(f"preparing {args.database_url.rsplit('/', 1)[-1]} ...", file=sys.stderr)
    prepare(args.database_url, args.history)
    sizes_before = index_sizes(args.database_url)
    run = Run(started=time.monotonic(), minutes=args.minutes)
    with connect(args.database_url) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0] == "on"
    if not autovacuum:
        run.vacuum = (
            f"server autovacuum off; VACUUM every {args.vacuum_every:g}s"
            if args.vacuum_every
            else "none (server autovacuum off)"
        )
    worker_ids = [f"soak-{i}:{os.getpid()}:{i:06x}" for i in range(args.workers)]
    threads = [
        threading.Thread(target=producer, args=(args.database_url, run, args.rate)),
        threading.Thread(target=heartbeats, args=(args.database_url, run, worker_ids)),
        threading.Thread(target=long_transaction, args=(args.database_url, run)),
        threading.Thread(target=sampler, args=(args.database_url, run)),
        *(
            threading.Thread(target=worker, args=(args.database_url, run, wid, args.work_ms / 1000))
            for wid in worker_ids
        ),
    ]
    if not autovacuum and args.vacuum_every:
        threads.append(
            threading.Thread(target=vacuumer, args=(args.database_url, run, args.vacuum_every))
        )
    for thread in threads:
        thread.daemon = True
        thread.start()
    print(
        f"running {args.minutes} min: {args.rate}/s, {args.workers} workers; "
        "long transaction in the middle third",
        file=sys.stderr,
    )
    try:
        while time.monotonic() - run.started < args.minutes * 60:
            time.sleep(1)
            elapsed = time.monotonic() - run.started
            if int(elapsed) % 30 == 0:
                recent = [s.seconds * 1000 for s in run.claims[-500:] if s.found]
                print(
                    f"  {elapsed:5.0f}s {run.phase()}: {run.finished} done, claim p50 "
                    f"{statistics.median(recent) if recent else 0:.2f} ms",
                    file=sys.stderr,
                )
    except KeyboardInterrupt:
        print("interrupted: reporting what ran", file=sys.stderr)
    run.stop.set()
    for thread in threads:
        thread.join(timeout=30)
    result = report(run, sizes_before, index_sizes(args.database_url))
    print_report(result)
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
