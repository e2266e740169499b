"""Wake-up latency: from the enqueueing transaction's commit to the job function's start.

    python bench/wakeup.py [--rate 100] [--seconds 10]

An idle worker (2 slots) receives jobs at a steady rate, each enqueued in its own transaction.
Each job returns the wall-clock time at which it started; the latency is that minus the time
the enqueueing commit returned (one clock: both run on this machine). Run once with LISTEN and
once polling only (``--poll-interval`` 1 s), and print p50/p99/max.

Uses ``DATABASE_URL`` (default: a ``bench_wakeup`` database on the local server).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
URL = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_wakeup")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


def setup_django() -> None:
    import django

    django.setup()


def run(listen: bool, rate: float, seconds: float) -> list[float]:
    from django.db import connection, transaction

    from django_jobs.models import Job
    from testproject.testjobs.jobs import stamp

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_jobs_job, django_jobs_attempt, django_jobs_dependency,"
            " django_jobs_step"
        )
    env = {**os.environ, "JOBS_LISTEN": "true" if listen else "false"}
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runjobworker", "--concurrency", "2", "--poll-interval", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Wait until the worker has started and run a first job, then let it go idle.
        probe = stamp.enqueue()
        deadline = time.monotonic() + 120
        while Job.objects.get(pk=probe.pk).state != "done":
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not start")
            time.sleep(0.1)
        time.sleep(1.5)
        committed: dict[int, float] = {}
        interval = 1.0 / rate
        start = time.monotonic()
        for n in range(int(rate * seconds)):
            delay = start + n * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with transaction.atomic():
                job = stamp.enqueue()
            committed[job.pk] = time.time()
        deadline = time.monotonic() + 30
        while Job.objects.filter(pk__in=committed).exclude(state="done").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("jobs did not finish")
            time.sleep(0.2)
        results = dict(Job.objects.filter(pk__in=committed).values_list("pk", "result"))
        return sorted((results[pk] - at) * 1000 for pk, at in committed.items())
    finally:
        worker.terminate()
        worker.wait(30)


def summary(label: str, latencies: list[float]) -> str:
    from bench.core import percentile  # between closest ranks: never beyond the largest sample

    return (
        f"| {label} | {len(latencies)} | {statistics.median(latencies):.2f} |"
        f" {percentile(latencies, 99):.2f} | {max(latencies):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="jobs per second (100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration per mode (10)")
    args = parser.parse_args()
    from bench.core import ensure_migrated

    ensure_migrated(URL)
    setup_django()
    print("| mode | jobs | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for label, listen in [("LISTEN/NOTIFY", True), ("polling (1 s)", False)]:
        print(summary(label, run(listen, args.rate, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
