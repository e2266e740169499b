"""The thundering herd: claim statements per job, and wake-up latency, with many idle workers.

    python bench/herd.py [--workers 1,10,50] [--jobs 100] [--rate 20] [--poll-interval 300]

For each number of idle ``runjobworker`` processes (concurrency 1, LISTEN on, polls
``--poll-interval`` apart: 300 s, so that the count is of the claims that notifications cause),
``--jobs`` jobs are enqueued one by one, each in its own transaction, at ``--rate`` a second.
PostgreSQL counts the claims (``track_functions = 'pl'`` counts the calls of
``django_jobs_claim``, the claim function). A session reports them at most once a second, and
what it did within a second of its last report only once it has been idle for 10 s: the count
is read once it has not moved for 11 s, before and after the jobs. Claims per job is the
count's rise, finish-and-claims included, divided by the jobs. The wake-up latency is the
job's start (the ``stamp`` job returns the wall clock) minus the time the enqueueing commit
returned, as in bench/wakeup.py.

Uses ``DATABASE_URL`` (default: a ``bench_herd`` database on the local server); the role must
be a superuser, to set ``track_functions``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
URL = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_herd")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


def claims() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE funcname = 'django_jobs_claim'"
        )
        return int(cursor.fetchone()[0])


def settled() -> int:
    """The claim count once every session has reported (unchanged for 11 s)."""
    last = claims()
    while True:
        time.sleep(11)
        now = claims()
        if now == last:
            return now
        last = now


def wait_until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:.0f}s")
        time.sleep(0.2)


def run(workers: int, jobs: int, rate: float, poll: float) -> tuple[float, list[float]]:
    """Claims per job, and the wake-up latencies in ms, with ``workers`` idle workers."""
    from django.db import connection, transaction

    from django_jobs.models import Job
    from testproject.testjobs.jobs import stamp

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_jobs_job, django_jobs_attempt, django_jobs_dependency,"
            " django_jobs_step"
        )
        cursor.execute("DELETE FROM django_jobs_worker")
    env = {**os.environ, "JOBS_LISTEN": "true"}
    started = [
        subprocess.Popen(
            [
                *(sys.executable, "manage.py", "runjobworker", "--no-scheduler"),
                *("--poll-interval", str(poll)),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(workers)
    ]
    try:
        # Every worker has started its executor and claimed once: one probe job each, then
        # quiet until they have all gone idle again.
        probes = [stamp.enqueue().pk for _ in range(workers)]
        wait_until(
            lambda: not Job.objects.filter(pk__in=probes).exclude(state="done").exists(),
            60 + 3 * workers,
            "the workers did not start",
        )
        before = settled()
        committed: dict[int, float] = {}
        start = time.monotonic()
        for n in range(jobs):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with transaction.atomic():
                job = stamp.enqueue()
            committed[job.pk] = time.time()
        wait_until(
            lambda: not Job.objects.filter(pk__in=committed).exclude(state="done").exists(),
            60,
            "the jobs did not finish",
        )
        spent = settled() - before
        results = dict(Job.objects.filter(pk__in=committed).values_list("pk", "result"))
        return spent / jobs, sorted((results[pk] - at) * 1000 for pk, at in committed.items())
    finally:
        for worker in started:
            worker.send_signal(signal.SIGTERM)
        for worker in started:
            worker.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,10,50", help="idle worker counts (1,10,50)")
    parser.add_argument("--jobs", type=int, default=100, help="jobs per run (100)")
    parser.add_argument("--rate", type=float, default=20.0, help="jobs per second (20)")
    parser.add_argument(
        "--poll-interval", type=float, default=300.0, help="workers' poll interval, s (300)"
    )
    args = parser.parse_args()
    from bench.core import ensure_migrated, percentile

    ensure_migrated(URL)
    import django

    django.setup()
    from django.db import connection

    with connection.cursor() as cursor:
        name = connection.settings_dict["NAME"]
        cursor.execute(f'ALTER DATABASE "{name}" SET track_functions = pl')
    connection.close()  # the next connection has the setting
    print("| idle workers | jobs | claims per job | wake-up p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for workers in (int(n) for n in args.workers.split(",")):
        per_job, latencies = run(workers, args.jobs, args.rate, args.poll_interval)
        print(
            f"| {workers} | {len(latencies)} | {per_job:.2f} |"
            f" {percentile(latencies, 50):.2f} | {percentile(latencies, 99):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
