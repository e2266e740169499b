"""Throughput: how fast workers drain a deep queue of pre-enqueued jobs.

Each run empties the system's tables, pre-enqueues ``jobs`` ready jobs, starts the workers
(burst mode: they exit when the queue is empty) and lets them work until ``warmup + window``
seconds after the first job finished, or until the queue is drained. The warm-up lasts at least
as long as the workers took to finish their first job, so that every slot is up. The rate is
counted from the jobs' own finish times, inside the window, so start-up (Django, executor
processes, connections) is not counted and a short window still measures the steady state.

Runs are interleaved: each repetition goes through every configuration and, within one, every
system, in an order rotated per repetition; the report gives the median of the repetitions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from bench.core import Context, Workload, spawn, steady_rate, stop_all
from bench.systems.base import System


@dataclasses.dataclass(frozen=True)
class Config:
    workload: Workload
    slots: int
    processes: int = 1
    #: Keys of the systems measured in this configuration.
    systems: tuple[str, ...] = ("ours", "floor")

    @property
    def key(self) -> str:
        return f"{self.workload.key}-{self.slots}x{self.processes}"

    @property
    def label(self) -> str:
        shape = f"{self.slots} slots" if self.slots > 1 else "1 slot"
        if self.processes > 1:
            shape += f" ({self.processes} processes)"
        return f"{self.workload.label}, {shape}"


@dataclasses.dataclass(frozen=True)
class Settings:
    jobs: int
    warmup: float
    window: float
    repetitions: int
    max_warmup: float = 8.0
    startup_timeout: float = 90.0


def run_once(ctx: Context, system: System, config: Config, settings: Settings) -> dict[str, Any]:
    name = f"throughput-{config.key}-{system.key}"
    with system.connect(ctx) as conn:
        system.reset(conn)
        system.prefill(conn, config.workload, settings.jobs)
        commands = system.worker_commands(ctx, config.workload, config.slots, config.processes)
        env = system.env(ctx)
        launched = time.monotonic()
        workers = [spawn(cmd, env, ctx.log(f"{name}-{i}")) for i, cmd in enumerate(commands)]
        try:
            while not system.any_finished(conn):
                if not any(w.running() for w in workers):
                    break
                if time.monotonic() - launched > settings.startup_timeout:
                    raise RuntimeError(f"{system.label}: no job finished within the start-up time")
                time.sleep(0.1)
            first_finish = time.monotonic()
            # Workers that took long to finish their first job (processes still booting on a
            # busy machine) get as long again, up to a bound, to bring up the rest of their slots.
            warmup = max(settings.warmup, min(first_finish - launched, settings.max_warmup))
            deadline = first_finish + warmup + settings.window
            while time.monotonic() < deadline and any(w.running() for w in workers):
                time.sleep(0.1)
        finally:
            stop_all(workers)
        times = system.finish_times(conn)
        failed = system.failed(conn)
    if failed:
        raise RuntimeError(f"{system.label}: {failed} job(s) failed in {name}; see its logs")
    rate = steady_rate(times, warmup, settings.window)
    cpu = sum(w.cpu_seconds or 0.0 for w in workers)
    return {
        "system": system.key,
        "config": config.key,
        "jobs_per_s": rate.per_second,
        "measured_jobs": rate.jobs,
        "measured_s": rate.seconds,
        "method": rate.method,
        "finished": len(times),
        "startup_s": first_finish - launched,
        "warmup_s": warmup,
        "worker_cpu_ms_per_job": 1000 * cpu / len(times) if times else None,
    }


def run(
    ctx: Context,
    systems: dict[str, System],
    configs: Sequence[Config],
    settings: Settings,
    progress: Any = print,
) -> list[dict[str, Any]]:
    """Every configuration on every system that runs it, ``repetitions`` times, interleaved."""
    results = []
    for repetition in range(settings.repetitions):
        for config in configs:
            keys = [k for k in config.systems if k in systems]
            shift = repetition % len(keys) if keys else 0
            for key in keys[shift:] + keys[:shift]:
                result = run_once(ctx, systems[key], config, settings)
                result["repetition"] = repetition
                results.append(result)
                progress(
                    f"  throughput {config.label:<32} {systems[key].label:<24} "
                    f"{result['jobs_per_s']:8.0f} jobs/s  (run {repetition + 1})"
                )
    return results
