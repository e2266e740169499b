"""Workers of the HTTP API against a real server (uvicorn, testproject.asgi): the curl and jq
worker of examples/, and a fleet of long-polling workers that the server serves on a few
connections."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from django_jobs.api import tokens
from django_jobs.models import Attempt, Job
from django_jobs.registry import registry
from tests.conftest import ROOT, ApiServer, wait_for

CURL_WORKER = ROOT / "examples" / "curl-worker.sh"


def test_curl_worker_runs_remote_jobs_and_stops_on_sigterm(
    start_api_server: Callable[..., ApiServer], curl: None, jq: None, tmp_path: Path
) -> None:
    server = start_api_server()
    _, secret = tokens.create("curl", ["remote"])
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    upper = registry.get("remote.upper")
    jobs = [upper.enqueue(word) for word in words]
    # Not a string: the worker's jq fails, and it finishes the job with outcome "error".
    bad = upper.using(max_attempts=1).enqueue(5)

    script = subprocess.Popen(
        ["bash", str(CURL_WORKER)],
        env={
            **os.environ,
            "API_URL": server.url,
            "TOKEN_FILE": str(token_file),
            "WORKER": "curl-test",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=[j.pk for j in [*jobs, bad]])
                .exclude(state__in=["done", "error"])
                .count()
                == 0
            ),
            timeout=60,
        )
        # Waiting in its long poll now: a SIGTERM ends it at once, cleanly.
        time.sleep(0.5)
        script.send_signal(signal.SIGTERM)
        output, _ = script.communicate(timeout=5)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.communicate()
    assert script.returncode == 0, output

    for job, word in zip(jobs, words, strict=True):
        job.refresh_from_db()
        assert (job.state, job.attempt, job.result) == ("done", 1, word.upper())
        assert job.worker_id == "api:curl:curl-test"
    bad.refresh_from_db()
    assert bad.state == "error"
    assert "explode input must be a string" in bad.error
    assert Attempt.objects.filter(job__in=[*jobs, bad]).count() == len(words) + 1


@pytest.fixture
def curl() -> None:
    """The test runs curl (tests/conftest.py skips it where Debian's curl is missing)."""


@pytest.fixture
def jq() -> None:
    """The test runs jq (tests/conftest.py skips it where Debian's jq is missing)."""
