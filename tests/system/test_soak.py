"""The soak benchmark stays runnable: a few seconds of it, on the test database."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.conftest import ROOT, database_url


def load_soak():
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "bench" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# A load of its own, timed: alone on the machine.
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_short_soak_reports_claim_latency_per_phase_and_table_health(tmp_path) -> None:
    soak = load_soak()
    output = tmp_path / "soak.json"
    args = ["--minutes", "0.15", "--rate", "50", "--workers", "2", "--history", "1000"]
    args += ["--vacuum-every", "2", "--database-url", database_url(), "--output", str(output)]
    assert soak.main(args) == 0
    result = json.loads(output.read_text())
    assert list(result["phases"]) == ["before", "during", "after"]
    assert all(phase["claims"] > 0 for phase in result["phases"].values())
    assert result["finished"] > 100 and not result["errors"]
    assert result["tables"]["django_jobs_worker"]["hot_share"] > 0.5  # heartbeats are HOT
    assert "job_claim_free_idx" in result["index_mb"]
