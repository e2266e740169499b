"""Latency: from an enqueue's commit to the job's start, on an idle worker.

A ``bench.stamp`` job returns ``time.time()`` as it starts; the probe notes ``time.time()``
right after ``enqueue()`` returned (autocommit, so the row is committed). Between samples it
waits a random fraction of the poll interval, so enqueues fall anywhere in the worker's poll
cycle. Each way of waking a worker is a :class:`Variant`: a LISTEN/NOTIFY worker is one more.

Run as ``python -m bench.latency`` it is the probe itself (a Django process on ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.core import (
    ROOT,
    Context,
    django_setup,
    emit,
    median,
    percentile,
    run_json,
    spawn,
    stop_all,
)
from bench.systems.base import System


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str
    label: str
    worker_args: tuple[str, ...]
    #: Seconds an idle worker may take to notice a new job; the gaps between samples span it.
    cycle: float


VARIANTS = (
    Variant("listen", "LISTEN/NOTIFY (default)", ("--poll-interval", "1"), 1.2),
    Variant("poll-1s", "polling every 1 s", ("--no-listen", "--poll-interval", "1"), 1.2),
    Variant("poll-100ms", "polling every 0.1 s", ("--no-listen", "--poll-interval", "0.1"), 0.12),
)


def run(
    ctx: Context,
    ours: System,
    variants: Sequence[Variant],
    samples: int,
    progress: Any = print,
) -> list[dict[str, Any]]:
    results = []
    for variant in variants:
        with ours.connect(ctx) as conn:
            ours.reset(conn)
        result = run_json(
            [
                ctx.python,
                "-m",
                "bench.latency",
                "--samples",
                str(samples),
                "--cycle",
                str(variant.cycle),
                "--log",
                str(ctx.log(f"latency-{variant.key}")),
                "--",
                *variant.worker_args,
            ],
            ours.env(ctx),
        )
        result["variant"] = variant.key
        result["label"] = variant.label
        results.append(result)
        progress(
            f"  latency    {variant.label:<32} p50 {1000 * result['p50_s']:6.1f} ms"
            f"  p99 {1000 * result['p99_s']:6.1f} ms"
        )
    return results


# ------------------------------------------------------------------ the probe


def probe(samples: int, cycle: float, log: str, worker_args: list[str]) -> dict[str, Any]:
    import os
    from pathlib import Path

    from bench.jobs import stamp
    from django_jobs.models import Job

    worker = spawn(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "runjobworker",
            "--worker-id",
            "latency",
            *worker_args,
        ],
        dict(os.environ),
        Path(log),
    )
    try:

        def started_at(job: Job, timeout: float = 30.0) -> float:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                state, result = Job.objects.filter(pk=job.pk).values_list("state", "result")[0]
                if state == "done":
                    return float(result)
                if state in ("error", "cancelled"):
                    raise RuntimeError(f"the latency job ended {state}")
                time.sleep(0.002)
            raise RuntimeError(f"the latency job did not run within {timeout}s; see {log}")

        started_at(stamp.enqueue(), timeout=60.0)  # the worker is up and idle
        latencies = []
        for _ in range(samples):
            time.sleep(random.uniform(0, cycle))
            job = stamp.enqueue()
            committed = time.time()
            latencies.append(started_at(job) - committed)
    finally:
        stop_all([worker])
    return {
        "samples": len(latencies),
        "p50_s": median(latencies),
        "p99_s": percentile(latencies, 99),
        "mean_s": sum(latencies) / len(latencies),
        "max_s": max(latencies),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--cycle", type=float, default=1.2)
    parser.add_argument("--log", required=True)
    parser.add_argument("worker_args", nargs="*")
    args = parser.parse_args(argv)
    django_setup()
    emit(probe(args.samples, args.cycle, args.log, args.worker_args))


if __name__ == "__main__":
    main(sys.argv[1:])
