"""The cost gate (``python -m bench.gate``): the hot path's cost per job, held to the baseline
kept in bench/baseline.json.

The gate holds statements and round trips per job, and buffers and WAL records of the claim and
the finish: what does not move with the machine's speed or load. It reports the CPU per job as a
ratio to the floor's in the same run, and holds it to nothing; see docs/benchmarks.md, "The cost
gate". When a change makes the hot path cost more on purpose, refresh the baseline with
``python -m bench.gate --update`` and commit it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from bench import gate
from tests.conftest import ROOT, connect, database_url

BASELINE = ROOT / "bench" / "baseline.json"


def run_gate(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "bench.gate", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def baseline() -> dict[str, Any]:
    return json.loads(BASELINE.read_text())


# Measures the hot path: alone on the machine.
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.django_db
def test_the_hot_path_costs_no_more_than_the_baseline(tmp_path: Path) -> None:
    prefix = f"{connection.settings_dict['NAME']}_bench_gate_"
    measured = tmp_path / "measured.json"
    run = run_gate("--db-prefix", prefix, "--json", str(measured), timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "figures within their tolerance" in run.stdout
    measurement = json.loads(measured.read_text())
    figures = measurement["figures"]
    assert set(figures) >= set(baseline()["figures"])
    # CPU is measured and reported, and held to nothing.
    assert [name for name in figures if "cpu" in name] == []
    assert measurement["reported"]["ours-1.cpu_ratio"] > 0
    assert "reported, not gated: ours-1.cpu_ratio " in run.stdout
    with connect() as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix]
        ).fetchall()
    assert left == []


def test_the_baseline_says_what_made_it_and_every_figure_has_a_tolerance() -> None:
    document = baseline()
    assert "python -m bench.gate --update" in document["comment"]
    assert document["settings"] == {**vars(gate.Settings()), **document["settings"]}
    for name in document["figures"]:
        gate.tolerance(name)  # raises for a figure the gate would not know how to hold
    kinds = {name.split(".", 1)[1] for name in document["figures"]}
    assert {"statements_per_job", "round_trips_per_job"} <= kinds
    assert {"call_claim.buffers", "claim_any_queue.buffers", "call_finish.buffers"} <= set(
        document["figures"]
    )
    assert {"call_claim.wal_records", "claim_any_queue.wal_records", "call_finish.wal_records"} <= (
        set(document["figures"])
    )
    # Only what does not move with the machine's load: no CPU figure.
    assert [name for name in document["figures"] if "cpu" in name] == []


def worse(tmp_path: Path, changes: dict[str, float]) -> Path:
    """A measurement equal to the baseline but for ``changes`` (added to its figures)."""
    document = baseline()
    figures = dict(document["figures"])
    for name, added in changes.items():
        figures[name] += added
    path = tmp_path / "measurement.json"
    path.write_text(json.dumps({"settings": document["settings"], "figures": figures}))
    return path


def test_a_measurement_equal_to_the_baseline_passes(tmp_path: Path) -> None:
    run = run_gate("--measurement", str(worse(tmp_path, {})))
    assert run.returncode == 0, run.stdout + run.stderr


def test_one_more_statement_per_job_or_more_buffers_fail_the_gate_naming_each(
    tmp_path: Path,
) -> None:
    figures = baseline()["figures"]
    claim_buffers = figures["call_claim.buffers"]
    grown = {
        "ours-1.statements_per_job": 1.0,
        "ours-4.round_trips_per_job": 0.1,
        "call_claim.buffers": max(4, 0.2 * claim_buffers),
    }
    run = run_gate("--measurement", str(worse(tmp_path, grown)))
    assert run.returncode == 1, run.stdout + run.stderr
    for name, added in grown.items():
        base = figures[name]
        assert f"{name} grew: baseline {base:.4g}, measured {base + added:.4g}" in run.stdout
    assert "python -m bench.gate --update" in run.stdout
    assert run.stdout.count(" grew: ") == len(grown)


def test_tolerances_let_small_growth_through_and_no_more() -> None:
    base = {
        "ours-1.statements_per_job": 1.03,  # exact to 0.05
        "call_finish.buffers": 87.0,  # +10 % or +3: here up to 95.7
        "claim_any_queue.buffers": 20.0,  # up to 23
        "call_claim.wal_records": 11.0,  # up to 14
    }
    within = [1.08, 95.0, 23.0, 14.0]
    beyond = [1.09, 96.0, 24.0, 15.0]
    assert gate.compare(base, dict(zip(base, within, strict=True)))[0] == []
    failures, _ = gate.compare(base, dict(zip(base, beyond, strict=True)))
    assert [f.split(" grew:")[0] for f in failures] == sorted(base)


def test_cpu_is_reported_and_never_gated(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        gate.tolerance("ours-1.cpu_ratio")  # no tolerance: it has no place in the baseline
    path = worse(tmp_path, {})
    measurement = json.loads(path.read_text())
    measurement["reported"] = {"ours-1.cpu_ratio": 1000.0, "ours-4.cpu_ratio": 0.001}
    path.write_text(json.dumps(measurement))
    run = run_gate("--measurement", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reported, not gated: ours-1.cpu_ratio 1000.00" in run.stdout
    assert "reported, not gated: ours-4.cpu_ratio 0.00" in run.stdout
    assert "figures within their tolerance" in run.stdout


def test_a_figure_of_the_baseline_left_unmeasured_fails_the_gate() -> None:
    failures, _ = gate.compare({"call_claim.buffers": 149.0}, {})
    assert failures == ["call_claim.buffers: in the baseline (149) but not measured"]
