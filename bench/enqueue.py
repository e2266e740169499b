"""Enqueue: single enqueues per second, each in its own transaction (autocommit), and bulk
enqueue rows per second, through each system's own API; next to the floor's raw single-row
``INSERT``, ``COPY`` and ``executemany`` into django-jobs' table. Interleaved like throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.core import Context
from bench.systems.base import System


def run(
    ctx: Context,
    systems: dict[str, System],
    keys: Sequence[str],
    *,
    single: int,
    bulk: int,
    repetitions: int,
    progress: Any = print,
) -> list[dict[str, Any]]:
    results = []
    keys = [k for k in keys if k in systems]
    for repetition in range(repetitions):
        shift = repetition % len(keys)
        for key in keys[shift:] + keys[:shift]:
            rates = systems[key].enqueue_bench(ctx, single, bulk)
            results.append({"system": key, "repetition": repetition, **rates})
            bulk_text = f"{rates['bulk']:9.0f}" if rates.get("bulk") else "      n/a"
            progress(
                f"  enqueue    {systems[key].label:<24} single {rates['single']:7.0f}/s"
                f"  bulk {bulk_text} rows/s  (run {repetition + 1})"
            )
    return results
