"""Where a draining worker's time goes: each process's CPU share, django-jobs next to the floor.

    python bench/cpu_split.py [--slots 4] [--jobs 30000] [--window 3]

No-op jobs are pre-enqueued; a worker drains them. Over a window of steady draining (after a
warm-up), it reads from ``/proc`` the CPU time of every process involved and reports each as a
share of one core, with the jobs finished per second:

- django-jobs: ``runjobworker --concurrency N`` (its supervisor, its N executors, and the
  PostgreSQL backend of its one queue connection);
- the floor: N bare psycopg processes (``bench/systems/floor.py``), each with its backend.

A supervisor and its backend work in turn, one statement at a time over one connection, so
their shares added up say how close the worker is to the limit of that chain (one core); the
floor's N connections work side by side. Uses ``DATABASE_URL`` (default: a ``bench_cpu``
database on the local server).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
URL = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_cpu")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        raise SystemExit(
            f"process {pid} ended before the window did: enqueue more jobs (--jobs)"
        ) from None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def backends(application_name_like: str) -> list[int]:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
            [application_name_like],
        ).fetchall()
    return [pid for (pid,) in rows]


def done_count(table: str) -> int:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as conn:
        return conn.execute(f"SELECT count(*) FROM {table} WHERE state = 'done'").fetchone()[0]


def measure(
    processes: dict[str, list[int]], table: str, warmup: float, window: float
) -> dict[str, Any]:
    time.sleep(warmup)
    before = {role: [cpu_seconds(pid) for pid in pids] for role, pids in processes.items()}
    done_before, start = done_count(table), time.monotonic()
    time.sleep(window)
    after = {role: [cpu_seconds(pid) for pid in pids] for role, pids in processes.items()}
    elapsed = time.monotonic() - start
    rate = (done_count(table) - done_before) / elapsed
    shares = {
        role: sum(a - b for a, b in zip(after[role], before[role], strict=True)) / elapsed
        for role in processes
    }
    return {"jobs_per_s": rate, "shares": shares}


def ours(slots: int, jobs: int, warmup: float, window: float) -> dict[str, Any]:
    import django

    django.setup()
    from django.db import connection

    from bench.jobs import noop

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_jobs_job, django_jobs_attempt, django_jobs_worker RESTART IDENTITY"
            " CASCADE"
        )
    noop.enqueue_many(((), {}) for _ in range(jobs))
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_jobs_job")
    command = [sys.executable, "manage.py", "runjobworker", "--burst", "--worker-id", "cpusplit"]
    worker = subprocess.Popen(
        [*command, "--concurrency", str(slots)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        processes = {
            "supervisor": [worker.pid],
            "executors": children(worker.pid),
            "its database backend": backends("cpusplit%"),
        }
        return measure(processes, "django_jobs_job", warmup, window)
    finally:
        worker.terminate()
        worker.wait(30)


def floor(slots: int, jobs: int, warmup: float, window: float) -> dict[str, Any]:
    import psycopg

    from bench.systems import floor as floor_system

    with psycopg.connect(URL, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('floor_job')").fetchone()[0] is None:
            conn.execute(floor_system.SCHEMA)
        conn.execute("TRUNCATE floor_job RESTART IDENTITY")
        conn.execute("INSERT INTO floor_job SELECT FROM generate_series(1, %s)", [jobs])
        conn.execute("VACUUM ANALYZE floor_job")
    env = {**os.environ, "PGAPPNAME": "cpusplit-floor"}
    command = [sys.executable, "-m", "bench.systems.floor", "worker"]
    workers = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        for _ in range(slots)
    ]
    try:
        time.sleep(1.0)
        processes = {
            "worker processes": [w.pid for w in workers],
            "their database backends": backends("cpusplit-floor%"),
        }
        return measure(processes, "floor_job", warmup, window)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=3.0)
    args = parser.parse_args()
    from bench.core import ensure_migrated

    ensure_migrated(URL)
    for label, run in (("django-jobs", ours), ("floor", floor)):
        result = run(args.slots, args.jobs, args.warmup, args.window)
        total = sum(result["shares"].values())
        print(f"{label}, {args.slots} slots: {result['jobs_per_s']:.0f} jobs/s")
        for role, share in result["shares"].items():
            per_job = 1e6 * share / result["jobs_per_s"] if result["jobs_per_s"] else 0.0
            print(f"  {role:<26} {100 * share:5.0f} % of a core   {per_job:6.0f} us per job")
        print(f"  {'all':<26} {100 * total:5.0f} % of a core")


if __name__ == "__main__":
    main()
