"""Structured logs: every claim, finish, retry, reap and lost lease carries its job's fields, and
``--log-format json`` prints one JSON object per line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from django.utils import timezone

from django_jobs.models import Job
from testproject.testjobs.jobs import ask_retry, echo, record
from tests.conftest import ROOT, wait_for
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"JOBS_HEARTBEAT_INTERVAL": "0.3", "JOBS_POLL_INTERVAL": "0.2"}


def json_lines(output: str) -> list[dict]:
    records = []
    for line in output.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def events(records: list[dict], job_id: int) -> list[dict]:
    return [r for r in records if r.get("job_id") == job_id and "event" in r]


def test_worker_json_logs_claim_finish_and_retry_with_their_fields(start_worker) -> None:
    done = echo.enqueue("hello")
    retried = ask_retry.enqueue(after=30)
    worker = start_worker("--burst", "--log-format", "json", env=FAST)
    assert worker.wait() == 0, worker.output
    records = json_lines(worker.output)
    assert records and all(isinstance(r, dict) for r in records)

    claim, finish = events(records, done.pk)
    assert claim["event"] == "claim" and finish["event"] == "finish"
    for line in (claim, finish):
        assert line["task"] == "tests.echo" and line["queue"] == "default"
        assert line["attempt"] == 1 and line["worker_id"].startswith(worker.name + ":")
    assert finish["outcome"] == "done" and finish["state"] == "done"
    # In seconds: milliseconds for an echo, and 30 s is room for any busy machine.
    assert isinstance(finish["duration"], float) and 0 <= finish["duration"] < 30
    assert {"time", "level", "logger", "message"} <= set(finish)

    claim, retry = events(records, retried.pk)
    assert retry["event"] == "retry" and retry["state"] == "pending"
    assert retry["outcome"] == "error" and retry["attempt"] == 1
    assert "duration" in retry


def test_a_lost_lease_is_logged_with_the_job_and_how_long_it_ran(start_worker) -> None:
    job = record.enqueue(note="taken away", seconds=20)
    worker = start_worker("--log-format", "json", "--grace", "0", env=FAST)
    wait_for(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
    # Someone else (a reaper that judged this worker dead) takes the job back. At its next
    # heartbeat the worker notices, stops the job, and, the job being ready, claims it again.
    Job.objects.filter(pk=job.pk).update(state="pending", worker_id=None)
    wait_for(lambda: Job.objects.filter(pk=job.pk, state="running", attempt=2).exists())
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    lost = [r for r in events(json_lines(worker.output), job.pk) if r["event"] == "lease_lost"]
    assert len(lost) == 1, worker.output
    assert (lost[0]["task"], lost[0]["attempt"], lost[0]["level"]) == ("tests.record", 1, "warning")
    assert lost[0]["worker_id"].startswith(worker.name + ":") and lost[0]["duration"] > 0


def test_reapjobs_json_logs_each_reap_with_queue_and_duration(worker_env) -> None:
    started = timezone.now() - timezone.timedelta(minutes=3)
    job = JobFactory(
        queue="reports",
        task="tests.sleep",
        claimed=True,
        worker_id="gone:1:abc",
        started_at=started,
    )
    AttemptFactory(job=job, worker_id="gone:1:abc", started_at=started)
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "reapjobs", "--log-format", "json"],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    (reap,) = events(json_lines(result.stderr), job.pk)
    assert reap["event"] == "reap" and reap["outcome"] == "lost" and reap["state"] == "pending"
    assert (reap["queue"], reap["task"], reap["attempt"]) == ("reports", "tests.sleep", 1)
    assert reap["worker_id"] == "gone:1:abc"
    # In seconds: started 3 minutes ago, 180 s and the command's start-up, with 7 minutes of
    # room for a busy machine (in milliseconds it would be 180,000).
    assert 170 < reap["duration"] < 600
