"""Workers of the HTTP API against a real server (uvicorn, testproject.asgi): the curl and jq
worker of examples/, and a fleet of long-polling workers that the server serves on a few
connections."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from django_jobs.enqueue import enqueue_many
from django_jobs.models import Attempt, Job, Step, Worker
from django_jobs.reaper import reap_pass
from django_jobs.registry import registry
from django_jobs.tokens import auth
from tests.conftest import ROOT, ApiServer, connect, wait_for
from tests.system.test_api_hostile import answer_of, long_poll, server_connections
from tests.timing import BUSY_MACHINE_MARGIN

CURL_WORKER = ROOT / "examples" / "curl-worker.sh"


def test_a_long_poll_whose_worker_hung_up_hands_its_job_to_nobody(
    start_api_server: Callable[..., ApiServer],
) -> None:
    server = start_api_server()
    _, secret = auth.create("hangup", ["remote"])
    headers = {"Authorization": f"Bearer {secret}"}
    body = {"worker": "gone", "queues": ["remote"], "wait": 20}
    # The worker gives up after 1 s (a client timeout, a worker stopped): its connection closes
    # while the server still waits for work on its behalf.
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "v1/claim", json=body, headers=headers, timeout=1)
    # The server has seen it go: it holds no connection open any more.
    wait_for(lambda: not server_connections(server))
    # A live worker waits in its long poll (its first claim made) when the job comes.
    alive = long_poll(server, secret, worker="alive", queues=["remote"], wait=20)
    wait_for(Worker.objects.filter(id="api:hangup:alive").exists)
    job = registry.get("remote.upper").enqueue("late")

    status, answer, _ = answer_of(alive)
    assert status == 200, answer
    claimed = json.loads(answer)["job"]
    assert (claimed["id"], claimed["attempt"]) == (job.pk, 1)
    job.refresh_from_db()
    assert job.worker_id == "api:hangup:alive"
    # Its one attempt is the live worker's: the one that hung up claimed it at no point.
    assert list(Attempt.objects.filter(job=job).values_list("number", "worker_id")) == [
        (1, "api:hangup:alive")
    ]


def test_curl_worker_runs_remote_jobs_and_stops_on_sigterm(
    start_api_server: Callable[..., ApiServer], curl: None, jq: None, tmp_path: Path
) -> None:
    server = start_api_server()
    _, secret = auth.create("curl", ["remote"])
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
        # Waiting in its long poll now: a SIGTERM ends it at once, cleanly (within what a busy
        # machine adds; a script that waited out its claim's 20 s would not).
        time.sleep(0.5)
        script.send_signal(signal.SIGTERM)
        output, _ = script.communicate(timeout=BUSY_MACHINE_MARGIN)
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


def start_curl_worker(server: ApiServer, token_file: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", str(CURL_WORKER)],
        env={**os.environ, "API_URL": server.url, "TOKEN_FILE": str(token_file), "WORKER": name},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def saved_cursor(job: Job) -> Any:
    job.refresh_from_db()
    return (job.cursors or {}).get("next", {}).get("value")


def test_curl_worker_resumes_a_killed_job_from_its_recorded_step_and_cursor(
    start_api_server: Callable[..., ApiServer], curl: None, jq: None, tmp_path: Path
) -> None:
    server = start_api_server()
    _, secret = auth.create("curl", ["remote"])
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    job = registry.get("remote.count").using(max_attempts=3).enqueue(8, 0.2)

    first = start_curl_worker(server, token_file, "curl-first")
    try:
        # Killed outright in the middle of its count, some numbers counted and saved.
        wait_for(lambda: (saved_cursor(job) or 0) >= 4, timeout=60)
        os.killpg(first.pid, signal.SIGKILL)
        first_output, _ = first.communicate(timeout=10)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    # Its worker went silent: the reaper frees the job, which is retried.
    Worker.objects.filter(pk="api:curl:curl-first").update(
        last_seen_at=timezone.now() - datetime.timedelta(hours=1)
    )
    assert [(a.job.lease.job_id, a.outcome) for a in reap_pass().actions] == [(job.pk, "lost")]
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    saved = saved_cursor(job)
    assert job.state == "pending" and 4 <= saved <= 8, first_output
    (started,) = Step.objects.filter(job_id=job.pk)
    assert (started.name, started.attempt) == ("started", 1)

    second = start_curl_worker(server, token_file, "curl-second")
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).state == "done", timeout=60)
        time.sleep(0.5)  # in its long poll again
        second.send_signal(signal.SIGTERM)
        output, _ = second.communicate(timeout=BUSY_MACHINE_MARGIN)  # as above
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
            second.communicate()
    assert second.returncode == 0, output

    job.refresh_from_db()
    # Attempt 2 went on from the number after the last one saved, and got the step's result back.
    assert (job.attempt, job.result) == (
        2,
        {"counted": 8, "from": saved, "started": started.result},
    )
    assert (job.cursors["next"]["value"], job.cursors["next"]["attempt"]) == (9, 2)
    assert Step.objects.filter(job_id=job.pk).count() == 1
    assert [a.outcome for a in job.attempts.order_by("number")] == ["lost", "done"]


@pytest.fixture
def curl() -> None:
    """The test runs curl (tests/conftest.py skips it where Debian's curl is missing)."""


@pytest.fixture
def jq() -> None:
    """The test runs jq (tests/conftest.py skips it where Debian's jq is missing)."""


# ---------------------------------------------------------------------- a fleet


class ConnectionSampler:
    """Samples, every ``interval`` seconds, the connections to the test database that are not
    this test process's own: the API server's. Its own connection is one of this process's."""

    def __init__(self, own_pids: list[int], interval: float = 0.1) -> None:
        self.conn = connect(application_name="djf-sampler")
        self.own = [*own_pids, self.conn.info.backend_pid]
        self.interval = interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            (count,) = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> ALL(%s)",
                [self.own],
            ).fetchone()
            self.samples.append(int(count))


@pytest.fixture
def claim_calls() -> Iterator[Callable[[], int]]:
    """``django_jobs_claim()``'s calls in the test database so far, counted by PostgreSQL
    (track_functions, set for the connections made after this fixture, and reset after)."""
    name = connection.settings_dict["NAME"]
    with connect() as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
    yield lambda: _claim_calls()
    with connect() as conn:
        conn.execute(f'ALTER DATABASE "{name}" RESET track_functions')


def _claim_calls() -> int:
    with connect() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE funcname = 'django_jobs_claim'"
        ).fetchone()
        return int(row[0])


async def _fleet(url: str, secret: str, workers: int, stop: asyncio.Event) -> dict[str, Any]:
    """``workers`` workers, each claiming (a long poll of 5 to 10 s) and finishing until
    ``stop`` is set; what they saw."""
    seen: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=workers + 10, max_keepalive_connections=workers + 10)
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=60
    ) as client:

        async def worker(n: int) -> None:
            body = {"worker": f"w{n}", "tasks": ["remote.upper"]}
            while not stop.is_set():
                claimed = await client.post(
                    "v1/claim", json={**body, "wait": random.uniform(5, 10)}
                )
                statuses[f"claim {claimed.status_code}"] += 1
                if claimed.status_code != 200:
                    continue
                job = claimed.json()["job"]
                seen[job["id"]] += 1
                finished = await client.post(
                    f"v1/jobs/{job['id']}/finish",
                    json={
                        "lease": job["lease"],
                        "outcome": "done",
                        "result": job["args"][0].upper(),
                    },
                )
                statuses[f"finish {finished.status_code}"] += 1

        tasks = [asyncio.create_task(worker(n)) for n in range(workers)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"seen": seen, "statuses": statuses}


# Two hundred workers: alone on the machine.
@pytest.mark.serial
@pytest.mark.slow
def test_two_hundred_long_polling_workers_share_four_connections_without_a_herd(
    start_api_server: Callable[..., ApiServer], claim_calls: Callable[[], int]
) -> None:
    api_connections, workers, batches, per_batch = 4, 200, 10, 200
    server = start_api_server({"JOBS_API_CONNECTIONS": str(api_connections)})
    _, secret = auth.create("fleet", ["remote"])
    calls_before = claim_calls()

    # The fleet runs in its own thread and event loop; this thread enqueues and watches.
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    outcome: dict[str, Any] = {}
    fleet = threading.Thread(
        target=lambda: outcome.update(
            loop.run_until_complete(_fleet(server.url, secret, workers, stop))
        )
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own_pid = cursor.fetchone()[0]
    upper = registry.get("remote.upper")
    with ConnectionSampler([own_pid]) as sampler:
        fleet.start()
        time.sleep(2)  # every worker waiting in its long poll
        ids = []
        for batch in range(batches):
            if batch % 2:
                ids += [
                    j.pk
                    for j in enqueue_many(
                        upper, [([f"b{batch}j{i}"], {}) for i in range(per_batch)]
                    )
                ]
            else:
                ids += [upper.enqueue(f"b{batch}j{i}").pk for i in range(per_batch)]
            time.sleep(0.2)
        deadline = time.monotonic() + 90
        while Job.objects.filter(pk__in=ids).exclude(state="done").exists():
            states = Counter(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
            assert time.monotonic() < deadline, f"{states}, answers {outcome}"
            time.sleep(0.2)
        loop.call_soon_threadsafe(stop.set)
        fleet.join(timeout=30)
    assert not fleet.is_alive()
    output = server.stop()  # its backends exit and flush their function counters
    calls = wait_for(lambda: claim_calls() - calls_before or None, timeout=10)

    jobs = len(ids)
    assert outcome["seen"] == Counter({job_id: 1 for job_id in ids}), output
    assert outcome["statuses"]["finish 200"] == jobs, outcome["statuses"]
    assert set(outcome["statuses"]) <= {"claim 200", "claim 204", "finish 200"}
    done = Job.objects.filter(pk__in=ids, state="done", attempt=1)
    assert done.count() == jobs
    assert Attempt.objects.filter(job__in=ids, outcome="done").count() == jobs

    assert sampler.samples and max(sampler.samples) >= 2, sampler.samples
    assert max(sampler.samples) <= min(api_connections + 1, 10), sampler.samples
    # Every job is one claim; the waits around them, less than two claims per job more.
    assert jobs <= calls < 3 * jobs, calls
