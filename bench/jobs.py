"""The jobs the benchmarks run on django-jobs. The peers run the same functions (see systems/)."""

from __future__ import annotations

import time
from typing import Any

from django_jobs import job


@job(name="bench.noop", max_attempts=1)
def noop(*args: Any, **kwargs: Any) -> None:
    return None


@job(name="bench.sleep", max_attempts=1)
def sleep(seconds: float) -> None:
    time.sleep(seconds)


@job(name="bench.stamp", max_attempts=1)
def stamp() -> float:
    """Return the moment the job started, for the latency benchmark (same machine, same clock)."""
    return time.time()
