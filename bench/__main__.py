"""``python -m bench``: run the suite with the installed packages (``bench/run.py`` first sets up
a virtualenv with the peers, then runs this).

    python -m bench                       # every part, the standard profile (~12 minutes)
    python -m bench --parts scale,cost    # some parts
    python -m bench --smoke               # a few hundred jobs, to check that the suite works
    python -m bench --full                # the peers on every throughput configuration too
    python -m bench --render artifacts/bench/results.json   # the tables of a past run again

The server is the one of ``DATABASE_URL`` (default: the local PostgreSQL); each system gets its
own database there, named ``bench_<system>`` (``--db-prefix`` to change), dropped and created
afresh. Results go to ``artifacts/bench/results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bench import api, cost, enqueue, latency, report, scale, throughput
from bench.core import DEFAULT_SERVER_URL, NOOP, ROOT, SLEEP, Context, Server
from bench.systems import PEERS, all_systems

PARTS = ("throughput", "enqueue", "latency", "scale", "cost", "api")


@dataclasses.dataclass(frozen=True)
class Profile:
    throughput: throughput.Settings
    configs: tuple[throughput.Config, ...]
    enqueue_single: int
    enqueue_bulk: int
    latency_variants: tuple[latency.Variant, ...]
    latency_samples: int
    scale_sizes: tuple[int, ...]
    scale_claims: int
    cost_setups: tuple[cost.Setup, ...]
    cost_jobs: int
    api_jobs: int = 20_000
    api_workers: int = 1_000


def standard(repetitions: int, full: bool) -> Profile:
    base = ("ours", "floor")
    configs = []
    for workload, peers_at, peers in (
        (NOOP, 4, PEERS),
        (SLEEP, 8, ("procrastinate", "tasks_db")),  # PgQueuer: see systems/pgqueuer_peer.py
    ):
        for slots in (1, 2, 4, 8):
            with_peers = full or slots == peers_at
            systems = base + (peers if with_peers else ())
            configs.append(throughput.Config(workload, slots, 1, systems))
    configs.append(throughput.Config(NOOP, 4, 2, base))
    configs.append(throughput.Config(SLEEP, 8, 4, base))
    return Profile(
        throughput=throughput.Settings(
            jobs=20_000, warmup=1.5, window=3.0, repetitions=repetitions
        ),
        configs=tuple(configs),
        enqueue_single=2_000,
        enqueue_bulk=20_000,
        latency_variants=latency.VARIANTS,
        latency_samples=20,
        scale_sizes=(1_000, 100_000, 1_000_000),
        scale_claims=200,
        cost_setups=cost.SETUPS,
        cost_jobs=2_000,
    )


def smoke() -> Profile:
    everyone = ("ours", "floor", *PEERS)
    return Profile(
        throughput=throughput.Settings(jobs=300, warmup=0.3, window=1.0, repetitions=1),
        configs=(
            throughput.Config(NOOP, 2, 1, everyone),
            throughput.Config(SLEEP, 2, 1, ("ours", "floor")),
        ),
        enqueue_single=50,
        enqueue_bulk=300,
        latency_variants=tuple(v for v in latency.VARIANTS if v.key in ("listen", "poll-100ms")),
        latency_samples=2,
        scale_sizes=(500, 2_000),
        scale_claims=10,
        cost_setups=cost.SETUPS[:1],
        cost_jobs=100,
        api_jobs=200,
        api_workers=50,
    )


def describe_machine(server: Server) -> dict[str, Any]:
    cpu = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB"
    with server.connect("postgres") as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0].split()[0]
        fsync = conn.execute("SHOW synchronous_commit").fetchone()[0]
    versions = {}
    for package in ("django", "psycopg", "procrastinate", "django-tasks-db", "pgqueuer"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return {
        "machine": (
            f"{os.cpu_count()} cores ({cpu}){memory}, PostgreSQL {pg} on the same machine "
            f"(synchronous_commit={fsync}), Python {platform.python_version()}"
        ),
        "versions": versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 bench/run.py", description="Run the suite.")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--smoke", action="store_true", help="a few hundred jobs, one run each")
    parser.add_argument("--full", action="store_true", help="peers on every configuration")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench")
    parser.add_argument("--db-prefix", default="bench_")
    parser.add_argument(
        "--scale-10m",
        action="store_true",
        help="the scale part goes on to 10,000,000 rows (its fill alone takes minutes)",
    )
    parser.add_argument("--drop", action="store_true", help="drop the bench databases at the end")
    parser.add_argument(
        "--render", type=Path, metavar="RESULTS_JSON", help="only print the tables of a past run"
    )
    args = parser.parse_args(argv)
    if args.render:
        print(report.markdown(json.loads(args.render.read_text())))
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    server = Server(os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL, args.db_prefix)
    ctx = Context(server=server, out=args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    profile = smoke() if args.smoke else standard(args.repetitions, args.full)
    if args.scale_10m:
        profile = dataclasses.replace(profile, scale_sizes=(*profile.scale_sizes, 10_000_000))
    systems = all_systems()
    skipped = {key: reason for key, s in systems.items() if (reason := s.unavailable())}
    available = {key: s for key, s in systems.items() if key not in skipped}
    started = time.monotonic()
    results: dict[str, Any] = {"skipped": skipped, "parts": parts}

    try:
        needed = set()
        if "throughput" in parts or "enqueue" in parts:
            needed |= set(available)
        if "latency" in parts or "cost" in parts:
            needed |= {"ours", "floor"}
        for key in available:
            if key in needed:
                progress(f"setting up {available[key].label} in database {server.database(key)}")
                available[key].setup(ctx)
        for key, reason in skipped.items():
            progress(f"skipping {systems[key].label}: {reason}")

        if "throughput" in parts:
            runs = throughput.run(ctx, available, profile.configs, profile.throughput, progress)
            results["throughput"] = {
                "settings": dataclasses.asdict(profile.throughput),
                "configs": [
                    {
                        "key": c.key,
                        "label": c.label,
                        "systems": [k for k in c.systems if k in available],
                    }
                    for c in profile.configs
                ],
                "runs": runs,
            }
        if "enqueue" in parts:
            results["enqueue_settings"] = {
                "single": profile.enqueue_single,
                "bulk": profile.enqueue_bulk,
            }
            results["enqueue"] = enqueue.run(
                ctx,
                available,
                ["ours", "floor", *PEERS],
                single=profile.enqueue_single,
                bulk=profile.enqueue_bulk,
                repetitions=profile.throughput.repetitions,
                progress=progress,
            )
        if "latency" in parts:
            results["latency"] = latency.run(
                ctx, available["ours"], profile.latency_variants, profile.latency_samples, progress
            )
        if "scale" in parts:
            results["scale"] = scale.run(ctx, profile.scale_sizes, profile.scale_claims, progress)
        if "cost" in parts:
            results["cost"] = cost.run(
                ctx,
                available["ours"],
                available["floor"],
                profile.cost_setups,
                profile.cost_jobs,
                progress,
            )
        if "api" in parts:
            results["api"] = api.run(
                ctx,
                profile.api_jobs,
                profile.api_workers,
                processes=4,
                concurrency=8,
                progress=progress,
            )
    finally:
        if args.drop:
            for key in [*systems, "scale", "api"]:
                server.drop(server.database(key))

    command = "python3 bench/run.py" + (" " + shlex.join(argv) if argv else "")
    results["meta"] = {
        **describe_machine(server),
        "finished": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "seconds": time.monotonic() - started,
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    text = report.markdown(results)
    (args.out / "results.md").write_text(text + "\n")
    print(text)
    progress(f"done in {results['meta']['seconds']:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
