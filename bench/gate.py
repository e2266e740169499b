"""The cost gate: fail when the hot path's cost per job grows against bench/baseline.json.

What it measures, in one run on a database it creates and drops (``--db-prefix``):

- **statements and round trips per job** on the queue connection of a django-jobs worker
  (libpq trace, :mod:`bench.cost`'s probe) over ``--jobs`` no-op jobs, with 1 slot and (in the
  first run only) with 4, in all and by kind (claim, finish+claim, heartbeat...);
- **buffers** that ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` counts (shared hit + read) for the claim
  as the worker runs it (``call_claim``), for its plain branch (``claim_any_queue``) and for the
  finish (``call_finish``) of the job just claimed, with the WAL records they write; on a table
  of fixed content, first thing on the fresh database (see :func:`buffers_probe`);
- **CPU per job** of the worker and of the backend serving it, as a ratio to the floor's (the
  raw psycopg loop of :mod:`bench.systems.floor`) measured in the same run: ``--runs``
  interleaved runs (1 slot, floor; again), each run's ratio, their median. Reported, not gated.

Statements, round trips, buffers and WAL records do not depend on the machine's speed or load,
so they are held to a small tolerance (:data:`TOLERANCES`). A figure that grew past its
tolerance is named with its baseline and its value, and the exit status is 1. CPU does depend
on them: the ratio to the floor read 3.2 to 5.1 on a 2-core machine at rest, and three days
later 10 to 16 on the same machine for a commit that had passed the gate, so a limit it never
crosses on noise is one that a hot path costing twice as much would not cross either. It is
printed and kept in the measurement (``reported``), and held to nothing. ``--update`` writes
the measurement as the new baseline; ``--json PATH`` keeps it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from psycopg import sql

from bench import scale
from bench.core import (
    DEFAULT_SERVER_URL,
    ROOT,
    Context,
    Server,
    django_setup,
    emit,
    median,
    run_json,
)
from bench.cost import FLOOR_STATEMENTS
from bench.systems import floor as floor_system
from bench.systems.ours import Ours
from bench.tracing import count

BASELINE = ROOT / "bench" / "baseline.json"
COMMAND = "python -m bench.gate"
UPDATE_COMMAND = f"{COMMAND} --update"

#: The worker setups measured: (key, slots). Each run measures the first; the first run, all
#: of them (their statements are the same in every run).
SETUPS = (("ours-1", 1), ("ours-4", 4))


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a measurement ran; the baseline keeps its own, and the gate measures with them, since
    the statements of a worker's start and stop are spread over ``jobs``."""

    jobs: int = 200  # no-op jobs per worker run
    floor_jobs: int = 600  # jobs per floor run
    runs: int = 3  # interleaved runs: statements' median, and the reported CPU ratio's
    repetitions: int = 5  # EXPLAIN rounds, after the warm-up ones


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a figure may grow past its baseline: ``absolute`` or ``relative`` (a fraction
    of the baseline), whichever allows more."""

    absolute: float
    relative: float = 0.0
    why: str = ""

    def limit(self, baseline: float) -> float:
        return baseline + max(self.absolute, self.relative * baseline)

    def describe(self) -> str:
        if self.relative and self.absolute:
            return f"+{self.relative:.0%} or +{self.absolute:g}, whichever is larger"
        if self.relative:
            return f"+{self.relative:.0%}"
        return f"+{self.absolute:g}"


#: By the figure's last name part. Statements and round trips per job are exact but for the
#: start-up and shutdown statements and the time-driven heartbeats, spread over the jobs (a few
#: thousandths per job); buffers and WAL records repeat exactly on the fixed table, the slack is
#: for a change of PostgreSQL version or page layout. Nothing else is gated: CPU is reported
#: only (see the module's docstring), and a figure with no tolerance here has no place in the
#: baseline.
TOLERANCES = {
    "per_job": Tolerance(0.05, why="statements or round trips per job"),
    "buffers": Tolerance(3, 0.10, why="buffers (shared hit + read)"),
    "wal_records": Tolerance(3, 0.10, why="WAL records"),
}


def tolerance(name: str) -> Tolerance:
    for suffix, value in TOLERANCES.items():
        if name.endswith(suffix):
            return value
    raise KeyError(f"no tolerance for the figure {name!r}")


# ------------------------------------------------------------------ the comparison


def compare(baseline: dict[str, float], measured: dict[str, float]) -> tuple[list[str], list[str]]:
    """The figures of ``measured`` that grew past their tolerance over ``baseline`` (one message
    each), and notes: figures that shrank well below the baseline, figures missing on one side."""
    failures, notes = [], []
    for name, base in sorted(baseline.items()):
        if name not in measured:
            failures.append(f"{name}: in the baseline ({base:g}) but not measured")
            continue
        value, allowed = measured[name], tolerance(name)
        limit = allowed.limit(base)
        if value > limit + 1e-9:
            failures.append(
                f"{name} grew: baseline {base:.4g}, measured {value:.4g}"
                f" (allowed up to {limit:.4g}: {allowed.describe()})"
            )
        elif value < base - (limit - base) - 1e-9:
            notes.append(f"{name} dropped: baseline {base:.4g}, measured {value:.4g}")
    notes += [
        f"{name}: {measured[name]:.4g}, new (not in the baseline)"
        for name in sorted(set(measured) - set(baseline))
    ]
    return failures, notes


def gate(baseline: dict[str, Any], measurement: dict[str, Any], out: Callable[[str], Any]) -> int:
    """Compare ``measurement`` with ``baseline`` (bench/baseline.json's content); say which
    figures grew, with their baseline and their value, and what is reported only (the CPU
    ratios); the exit status."""
    failures, notes = compare(baseline["figures"], measurement["figures"])
    if measurement.get("settings") != baseline.get("settings"):
        failures.insert(
            0,
            f"measured with {measurement.get('settings')}, the baseline with"
            f" {baseline.get('settings')}: per-job figures are not comparable",
        )
    for note in notes:
        out(f"note: {note}")
    for name, value in sorted(measurement.get("reported", {}).items()):
        out(f"reported, not gated: {name} {value:.2f} (CPU per job over the floor's, same run)")
    if failures:
        out("The cost per job grew past the baseline (bench/baseline.json):")
        for failure in failures:
            out(f"  {failure}")
        out(
            "If that is intended, refresh the baseline with"
            f" `{UPDATE_COMMAND}` and commit bench/baseline.json."
        )
        return 1
    out(f"cost gate: all {len(baseline['figures'])} figures within their tolerance")
    return 0


def baseline_document(measurement: dict[str, Any]) -> dict[str, Any]:
    meta = measurement["meta"]
    return {
        "comment": (
            f"Written by `{UPDATE_COMMAND}` on {meta['finished']}, on"
            f" {meta['machine']}, load average {meta['load_average']}. Statements and round"
            " trips per job of a django-jobs worker on no-op jobs (median of the runs), buffers"
            " and WAL records of EXPLAIN (ANALYZE, BUFFERS, WAL) on a fixed table (median of"
            " the rounds). CPU per job is reported by the gate, not gated, and not kept here."
            " Tolerances: TOLERANCES in bench/gate.py."
            f" Refresh with `{UPDATE_COMMAND}` (docs/benchmarks.md, 'The cost gate')."
        ),
        "settings": measurement["settings"],
        "figures": {name: round(value, 4) for name, value in measurement["figures"].items()},
    }


# ------------------------------------------------------------------ the measurement


def measure(
    server: Server,
    settings: Settings,
    progress: Callable[[str], Any] = print,
    keep: bool = False,
) -> dict[str, Any]:
    """Measure every figure once, on a database of ``server`` it creates and drops."""
    jobs, floor_jobs, runs = settings.jobs, settings.floor_jobs, settings.runs
    started = time.monotonic()
    ctx = Context(server=server, out=Path(tempfile.mkdtemp(prefix="bench-gate-")))
    ours = Ours()
    database = ours.database(ctx)

    def step(line: str) -> None:
        progress(f"[{time.monotonic() - started:5.1f} s] {line}")

    try:
        step(f"creating and migrating {database}")
        server.recreate(database)
        ours.install(ctx)
        # First, on the freshly migrated database, so that its history is the same every time.
        step("buffers: EXPLAIN (ANALYZE, BUFFERS, WAL) of the claim and the finish")
        buffers = run_json(
            [ctx.python, "-m", "bench.gate", "--probe-buffers", str(settings.repetitions)],
            ours.env(ctx),
        )
        step("cost per job: workers on no-op jobs, and the floor, interleaved")
        with ours.connect(ctx) as conn:
            conn.execute(floor_system.SCHEMA)
        runs_measured: list[dict[str, Any]] = []
        for number in range(1, runs + 1):
            run: dict[str, Any] = {}
            for key, slots in SETUPS if number == 1 else SETUPS[:1]:
                with ours.connect(ctx) as conn:
                    ours.reset(conn)
                probe = run_json(
                    [
                        ctx.python,
                        "-m",
                        "bench.cost",
                        "--jobs",
                        str(jobs),
                        "--concurrency",
                        str(slots),
                    ],
                    ours.env(ctx),
                )
                run[key] = _per_job(key, probe, jobs)
            run["floor"] = _floor_run(ctx, ours, floor_jobs)
            for key, _ in SETUPS:
                if key in run:
                    floor = run["floor"]["cpu_s_per_job"]
                    run[key]["cpu_ratio"] = run[key]["cpu_s_per_job"] / floor
            step(
                f"run {number}/{runs}: "
                + ", ".join(
                    f"{key} {run[key]['statements_per_job']:.4f} statements/job,"
                    f" CPU {run[key]['cpu_ratio']:.2f}x the floor's"
                    for key, _ in SETUPS
                    if key in run
                )
                + f" ({1e6 * run['floor']['cpu_s_per_job']:.0f} us/job)"
            )
            runs_measured.append(run)
    finally:
        shutil.rmtree(ctx.out, ignore_errors=True)
        if not keep:
            server.drop(database)

    figures: dict[str, float] = {}
    reported: dict[str, float] = {}
    for key, _ in SETUPS:
        measured = [run[key] for run in runs_measured if key in run]
        for figure in ("statements_per_job", "round_trips_per_job"):
            figures[f"{key}.{figure}"] = median([m[figure] for m in measured])
        for kind in sorted({kind for m in measured for kind in m["by_kind"]}):
            figures[f"{key}.{kind}.per_job"] = median(
                [m["by_kind"].get(kind, 0.0) for m in measured]
            )
        reported[f"{key}.cpu_ratio"] = median([m["cpu_ratio"] for m in measured])
    for statement, measured in buffers["statements"].items():
        figures[f"{statement}.buffers"] = measured["buffers"]
        figures[f"{statement}.wal_records"] = measured["wal_records"]
    return {
        "figures": figures,
        "reported": reported,
        "runs": runs_measured,
        "buffers": buffers,
        "settings": dataclasses.asdict(settings),
        "meta": {
            "seconds": round(time.monotonic() - started, 1),
            "load_average": [round(x, 1) for x in os.getloadavg()],
            "machine": _machine(server),
            "finished": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        },
    }


def _per_job(key: str, probe: dict[str, Any], jobs: int) -> dict[str, Any]:
    if probe["jobs"] != jobs:
        raise RuntimeError(f"{key}: ran {probe['jobs']} jobs, expected {jobs}")
    worker = probe["supervisor_cpu_s"] + probe["executors_cpu_s"]
    return {
        "statements_per_job": probe["statements"] / jobs,
        "round_trips_per_job": probe["round_trips"] / jobs,
        "by_kind": {kind: n / jobs for kind, n in sorted(probe["by_kind"].items())},
        "worker_cpu_s_per_job": worker / jobs,
        "db_cpu_s_per_job": probe["db_cpu_s"] / jobs,
        "cpu_s_per_job": (worker + probe["db_cpu_s"]) / jobs,
    }


def _floor_run(ctx: Context, ours: Ours, jobs: int) -> dict[str, Any]:
    """The floor's worker over ``jobs`` jobs of its own table (in the same database), traced as
    django-jobs' queue connection is, so that both pay the same for the trace."""
    with ours.connect(ctx) as conn:
        conn.execute("TRUNCATE floor_job RESTART IDENTITY")
        conn.execute("INSERT INTO floor_job (args) SELECT '[]' FROM generate_series(1, %s)", [jobs])
        conn.execute("ANALYZE floor_job")
    trace = ctx.out / "floor.trace"
    command = [ctx.python, "-m", floor_system.__name__, "worker", "--trace", str(trace)]
    measured = run_json(command, ours.env(ctx))
    if measured["jobs"] != jobs:
        raise RuntimeError(f"floor: ran {measured['jobs']} jobs, expected {jobs}")
    counts = count(trace, FLOOR_STATEMENTS)
    trace.unlink()
    return {
        "statements_per_job": counts.statements / jobs,
        "worker_cpu_s_per_job": measured["worker_cpu_s"] / jobs,
        "db_cpu_s_per_job": measured["db_cpu_s"] / jobs,
        "cpu_s_per_job": (measured["worker_cpu_s"] + measured["db_cpu_s"]) / jobs,
    }


def _machine(server: Server) -> str:
    with server.connect("postgres") as conn:
        version = conn.execute("SHOW server_version").fetchone()[0].split()[0]
    return f"{os.cpu_count()} cores, PostgreSQL {version}"


# ------------------------------------------------------------------ the buffers probe

#: The fixed content of the table the buffers are counted on: READY ready jobs first (claimed
#: in id order), then FILLER rows of what a long-lived queue keeps (bench/scale.py's mix of
#: finished, failed, waiting and scheduled jobs, with their attempts).
READY = 200
FILLER = 5_000
WORKER_ID = "gate:1:x"
_TABLES = ("django_jobs_job", "django_jobs_attempt", "django_jobs_worker")
_WORKER = """
INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency, started_at,
                                last_seen_at, boot_id)
VALUES (%s, 'gate', 'bench', 1, '[]', 1, now(), now(), '')
"""
_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")
_WAL = re.compile(r"WAL: records=(\d+)(?: fpi=(\d+))?(?: bytes=(\d+))?")


def buffers_probe(repetitions: int, warmup: int = 6) -> dict[str, Any]:
    """Buffers and WAL records of the claim, its plain branch and the finish, each the median
    over ``repetitions`` rounds after ``warmup`` unrecorded ones.

    Buffer counts move with the state of the pages (hint bits, the visibility map, dead index
    entries left by earlier claims, pruning, free space), so every statement starts from the
    same state: the table is filled once with fixed content and analysed, autovacuum is off on
    it, and each statement of a round (a claim, committed as the worker's is; the finish of that
    job, committed; the plain branch, rolled back) is preceded by ``VACUUM (FREEZE)``, which
    leaves every page frozen and all-visible and no dead tuple or index entry behind. Otherwise
    a statement would prune the tuples its predecessor left dead, or not, depending on whether
    a transaction in *another* database was open at that moment (the cluster-wide snapshot
    horizon). (Not ``ANALYZE``: each one rewrites the statistics rows, and reading those
    catalogs then costs more, round by round.) The VACUUM invalidates the tables' cache entries,
    so they are read again before the statement, and catalog reads are not counted. The warm-up
    rounds fill the session's caches (the PL/pgSQL functions' plans settle after their fifth
    run) as a busy worker's are. The sequence is the same on every run, on a freshly migrated
    database, so its counts are too.
    """
    import psycopg
    from django.db import connection

    from django_jobs import store
    from django_jobs.store import claiming
    from django_jobs.store.sql import query

    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params)

    def vacuum(options: str) -> None:
        conn.autocommit = True
        for table in _TABLES:
            conn.execute(sql.SQL(f"VACUUM ({options}) {{}}").format(sql.Identifier(table)))
        conn.autocommit = False

    with conn.cursor() as cursor:
        for table in _TABLES:
            cursor.execute(
                sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(
                    sql.Identifier(table)
                )
            )
    conn.commit()
    # Autovacuum of the catalogs that the migrations left dead rows in would come at any time,
    # and change what reading them costs: vacuumed now, they give it nothing to do.
    conn.autocommit = True
    conn.execute("VACUUM (FREEZE, ANALYZE)")
    conn.autocommit = False
    with conn.cursor() as cursor:
        cursor.execute(scale._READY, {"count": READY})
        cursor.execute(scale._FILL, {"count": FILLER})
        cursor.execute(scale._FILL_ATTEMPTS, {"after": READY})
        cursor.execute(_WORKER, [WORKER_ID])
    conn.commit()
    vacuum("FREEZE, ANALYZE")

    claim_params = claiming.claim_params(WORKER_ID, None)
    branch_sql, branch_params = store.claim_sql(None)
    branch_params = {"worker_id": WORKER_ID, **branch_params}
    rounds: list[dict[str, dict[str, Any]]] = []
    plans: dict[str, str] = {}

    def settle() -> None:
        vacuum("FREEZE")
        for table in _TABLES:  # VACUUM invalidated their cache entries: read them again now
            conn.execute(
                sql.SQL("EXPLAIN SELECT FROM {} WHERE id IS NULL").format(sql.Identifier(table))
            )
        conn.rollback()

    for _ in range(warmup + repetitions):
        settle()
        measured = {}
        measured["call_claim"], plans["call_claim"] = _explain(
            conn, query("call_claim"), claim_params
        )
        conn.commit()
        job_id, attempt, lease = conn.execute(
            "SELECT id, attempt, lease FROM django_jobs_job"
            " WHERE state = 'running' AND worker_id = %s",
            [WORKER_ID],
        ).fetchone()
        conn.commit()
        finish = {
            "job_id": job_id,
            "attempt": attempt,
            "worker_id": WORKER_ID,
            "lease": lease,
            "outcome": "done",
            "result": "null",
            "error": "",
            "traceback": "",
            "retryable": True,
            "retry_delay": 0.0,
        }
        settle()
        measured["call_finish"], plans["call_finish"] = _explain(conn, query("call_finish"), finish)
        conn.commit()
        settle()
        measured["claim_any_queue"], plans["claim_any_queue"] = _explain(
            conn, branch_sql, branch_params
        )
        conn.rollback()
        rounds.append(measured)
    with conn.cursor() as cursor:  # for the worker runs that follow on the same database
        for table in _TABLES:
            cursor.execute(
                sql.SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(sql.Identifier(table))
            )
    conn.commit()
    conn.close()
    kept = rounds[warmup:]
    statements = {}
    for name in rounds[0]:
        statements[name] = {
            figure: median([r[name][figure] for r in kept])
            for figure in ("buffers", "wal_records", "wal_bytes")
        }
        statements[name]["each"] = [r[name]["buffers"] for r in rounds]
    return {"statements": statements, "plans": plans, "ready": READY, "filler": FILLER}


def _explain(conn: Any, statement: str, params: dict[str, Any]) -> tuple[dict[str, int], str]:
    """Buffers (shared hit + read) and WAL of the top node of ``statement``'s EXPLAIN (ANALYZE):
    what the statement touched in all, the inner statements of a function included."""
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + statement, params).fetchall()
    plan = "\n".join(row[0] for row in rows)
    top = plan.split("\nPlanning")[0]
    buffers = _BUFFERS.search(top)
    wal = _WAL.search(top)
    if buffers is None:
        raise RuntimeError(f"no buffers counted in the plan:\n{plan}")
    return {
        "buffers": int(buffers.group(1) or 0) + int(buffers.group(2) or 0),
        "wal_records": int(wal.group(1)) if wal else 0,
        "wal_bytes": int(wal.group(3) or 0) if wal else 0,
    }, plan


# ------------------------------------------------------------------ the command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update", action="store_true", help="write the measurement as baseline")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the measurement here")
    parser.add_argument(
        "--measurement", type=Path, metavar="PATH", help="compare this measurement, measure none"
    )
    parser.add_argument("--db-prefix", default="bench_gate_")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    for field in dataclasses.fields(Settings):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=int,
            help=f"default: the baseline's ({field.default} with --update)",
        )
    parser.add_argument("--probe-buffers", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.probe_buffers:
        django_setup()
        emit(buffers_probe(args.probe_buffers))
        return 0

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    baseline = json.loads(args.baseline.read_text()) if args.baseline.exists() else None
    if args.measurement:
        measurement = json.loads(args.measurement.read_text())
    else:
        # The baseline's settings, to compare with it; the code's, to write a new one.
        settings = Settings(**({} if args.update else (baseline or {}).get("settings", {})))
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)}
        settings = dataclasses.replace(settings, **{k: v for k, v in given.items() if v})
        server = Server(os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL, args.db_prefix)
        measurement = measure(server, settings, progress, args.keep)
        measurement["meta"]["command"] = shlex.join([*COMMAND.split(), *(argv or [])])
    for name, value in sorted(measurement["figures"].items()):
        progress(f"  {name:<40} {value:10.4f}")
    if args.json:
        args.json.write_text(json.dumps(measurement, indent=2) + "\n")
    if args.update:
        args.baseline.write_text(json.dumps(baseline_document(measurement), indent=2) + "\n")
        print(f"baseline written to {args.baseline}")
        return 0
    if baseline is None:
        parser.error(f"no baseline at {args.baseline}: write one with {UPDATE_COMMAND}")
    return gate(baseline, measurement, print)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
