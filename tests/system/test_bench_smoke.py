"""The benchmark suite (bench/), end to end on a few hundred jobs, so that it does not rot.

The numbers of such a short run mean nothing; what is checked is that every part runs through
the same code as a full run and reports what it should. Peers that are not installed (the
``bench`` extra) are skipped with a reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import ROOT, connect, database_url
from tests.timing import BUSY_MACHINE_MARGIN

# The benchmarks time what they run: alone on the machine.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.serial]

PARTS = ["throughput", "enqueue", "latency", "scale", "cost", "api"]
PEERS = {"procrastinate", "tasks_db", "pgqueuer"}


def test_smoke_run_of_the_benchmark_suite_measures_every_part(tmp_path: Path) -> None:
    # Databases of our own, named after this run's test database, dropped at the end.
    prefix = f"{connection.settings_dict['NAME']}_bench_"
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--drop",
            "--db-prefix",
            prefix,
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["parts"] == PARTS

    measured = {r["system"] for r in results["throughput"]["runs"]}
    assert {"ours", "floor"} <= measured
    assert (measured & PEERS) | set(results["skipped"]) == PEERS
    for run_ in results["throughput"]["runs"]:
        assert run_["jobs_per_s"] > 0 and run_["finished"] > 0, run_
    configs = {c["key"]: c for c in results["throughput"]["configs"]}
    assert set(configs) == {"noop-2x1", "sleep-2x1"}

    enqueued = {r["system"]: r for r in results["enqueue"]}
    assert enqueued["ours"]["single"] > 0 and enqueued["ours"]["bulk"] > 0
    assert enqueued["floor"]["single"] > 0 and enqueued["floor"]["bulk"] > 0

    latency = {r["variant"]: r for r in results["latency"]}
    assert set(latency) == {"listen", "poll-100ms"}
    # Milliseconds woken by LISTEN, about half the 100 ms poll otherwise; the margin is a busy
    # machine's (this is a smoke run: the bench's own figures are what it reports).
    assert all(r["samples"] == 2 and 0 < r["p50_s"] < BUSY_MACHINE_MARGIN for r in latency.values())

    sizes = results["scale"]["sizes"]
    assert [s["rows"] for s in sizes] == [500, 2_000]
    assert all(s["claim_uses_index"] and s["claim_s"] > 0 for s in sizes)
    assert results["scale"]["claim_ratio"] > 0

    cost = {row["setup"]: row for row in results["cost"]["workers"]}
    kinds = cost["ours-1"]["by_kind_per_job"]
    # Every job is finished once; a busy worker claims the next job with that finish.
    assert kinds.get("finish", 0) + kinds.get("finish+claim", 0) == 1
    assert kinds.get("claim", 0) + kinds.get("finish+claim", 0) >= 1
    assert 1 <= cost["ours-1"]["round_trips_per_job"] < 1.5
    assert 2 <= cost["floor"]["statements_per_job"] < 2.5
    assert len(results["cost"]["statements"]) == 3
    assert all(row["claim_rt_us"] > 0 for row in results["cost"]["statements"])

    report = (tmp_path / "results.md").read_text()
    for heading in (
        "### Targets",
        "### Throughput",
        "### Enqueue",
        "### Latency",
        "### Scale",
        "### Cost per job",
    ):
        assert heading in report
    assert "No-op, 4 slots" in report  # targets the smoke run cannot measure are listed too

    with connect() as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix]
        ).fetchall()
    assert left == []

    api = results["api"]
    for mode in ("api", "db"):
        assert api[mode]["jobs_per_s"] > 0 and api[mode]["db_cpu_per_job_s"] > 0, api[mode]
    # The API's statements run on its 4 connections, plus 1 for its LISTEN.
    assert 1 <= api["api"]["max_connections"] <= api["api_connections"] + 1
    assert api["api"]["answers"]["finish 200"] == api["jobs"]
    assert 0 < api["api"]["claim_p50_s"] <= api["api"]["claim_p99_s"]
