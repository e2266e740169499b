"""KubernetesLiveness against a recorded pod-list response served over local HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.test.utils import override_settings

from django_jobs.liveness import KubernetesLiveness
from django_jobs.models import Job, Worker
from django_jobs.reaper import reap
from tests.factories import AttemptFactory, JobFactory, WorkerFactory

pytestmark = pytest.mark.django_db

PODS = (Path(__file__).parent / "data" / "pods.json").read_bytes()
ALIVE = "jobs-worker-6d9c7f8b5d-2xkqp"
RESTARTED = "jobs-worker-6d9c7f8b5d-r8vzt"
GONE = "jobs-worker-6d9c7f8b5d-dead1"


@pytest.fixture
def api() -> Iterator[dict]:
    seen: dict = {"requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen["requests"].append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/api/v1/namespaces/jobs/pods"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(PODS)
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield seen
    server.shutdown()


def running_on(name: str, silent_for: int = 30) -> Job:
    worker = WorkerFactory(id=f"{name}:1:abc123", name=name)
    Worker.objects.filter(pk=worker.pk).update(
        last_seen_at=worker.started_at - timedelta(seconds=silent_for)
    )
    job = JobFactory(claimed=True, worker_id=worker.id)
    AttemptFactory(job=job, number=1, worker_id=worker.id)
    return job


def test_pods_that_are_gone_or_restarted_mean_dead_workers(api) -> None:
    settings = {
        "JOBS_KUBERNETES": {
            "api_url": api["url"],
            "token": "sa-token",
            "namespace": "jobs",
            "label_selector": "app=jobs-worker",
        },
        "JOBS_HEARTBEAT_INTERVAL": 10,
        "JOBS_WORKER_TIMEOUT": 60,  # none of these workers is stale by heartbeat alone
    }
    alive, restarted, gone = running_on(ALIVE), running_on(RESTARTED), running_on(GONE)
    # The restarted pod's worker was first seen before its container was OOM-killed.
    Worker.objects.filter(name=RESTARTED).update(
        boot_id="a7e4b1c2-0d3f-4e5a-8b6c-9d0e1f2a3b4c,containerd://0ld0ld"
    )
    with override_settings(**settings):
        report = reap(liveness=KubernetesLiveness())

    reaped = {a.job.lease.job_id: a.reason for a in report.actions if a.new_state}
    assert set(reaped) == {restarted.pk, gone.pk}
    assert f"pod {GONE} no longer exists" in reaped[gone.pk]
    assert f"pod {RESTARTED} has restarted" in reaped[restarted.pk]
    assert Job.objects.get(pk=alive.pk).state == "running"
    # The live pod's boot identity was recorded on first sight, to notice a later restart.
    assert Worker.objects.get(name=ALIVE).boot_id.startswith(
        "3f1c2a9e-7b8d-4c1e-9a60-2f0e8c1d7a11,"
    )
    path, auth = api["requests"][0]
    assert path == "/api/v1/namespaces/jobs/pods?labelSelector=app%3Djobs-worker"
    assert auth == "Bearer sa-token"


def test_a_worker_whose_pod_is_missing_but_still_beats_is_left_alone(api) -> None:
    settings = {"JOBS_KUBERNETES": {"api_url": api["url"], "namespace": "jobs"}}
    job = running_on(GONE, silent_for=1)  # heartbeat one second ago: it is alive somewhere
    with override_settings(**settings):
        report = reap(liveness=KubernetesLiveness())
    assert [a.new_state for a in report.actions] == [None]  # judged, but the re-check refused
    assert Job.objects.get(pk=job.pk).state == "running"


def test_the_recorded_response_is_a_real_pod_list() -> None:
    body = json.loads(PODS)
    assert body["kind"] == "PodList"
    assert {p["metadata"]["name"] for p in body["items"]} == {ALIVE, RESTARTED}
