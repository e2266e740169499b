"""``runjobworker --api``: real workers of the HTTP API, served by uvicorn on the test database,
run jobs as database-connected workers do, with no connection to the jobs database."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from django_jobs.models import Attempt, Job, Step, Worker
from testproject.testjobs.jobs import (
    asks_if_cancelled,
    chatty,
    crash,
    cursor_loop,
    echo,
    five_steps,
    record,
    retry_then_succeed,
    sleep,
    spawner,
    step_then_cursor,
    tree,
)
from testproject.testjobs.models import Execution
from tests.conftest import ApiServer, WorkerProcess, connect, wait_for
from tests.system.helpers import FAST_API_WORKER, journal
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api_url(api_server: ApiServer) -> str:
    return api_server.url


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A file holding a token for every queue, which may enqueue (a job spawns through it)."""
    from django_jobs.tokens import auth

    _, secret = auth.create(f"t-{uuid.uuid4().hex[:8]}", ["*"], can_enqueue=True)
    path = tmp_path / "token"
    path.write_text(secret + "\n")
    return path


@pytest.fixture
def start_api_worker(
    start_worker: Callable[..., WorkerProcess], api_url: str, token_file: Path
) -> Callable[..., WorkerProcess]:
    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        options = ["--api", api_url, "--token-file", str(token_file)]
        return start_worker(*options, *args, env={**FAST_API_WORKER, **(env or {})})

    return start


def state_of(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def jobs_database_sessions_of(worker: WorkerProcess) -> list[tuple[str, str]]:
    """The sessions named after the worker's id: those of a database-connected supervisor (its
    queue connection, its LISTEN)."""
    with connect() as observer:
        rows = observer.execute(
            "SELECT application_name, state FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE %s",
            [worker.name + ":%"],
        ).fetchall()
    return [(str(name), str(state)) for name, state in rows]


def test_an_api_worker_runs_the_standard_mix_without_a_jobs_database_connection(
    start_api_worker: Callable[..., WorkerProcess],
) -> None:
    ok = echo.enqueue(1, "a", flag=True)
    flaky = retry_then_succeed.enqueue(succeed_on=2)
    slow = sleep.using(timeout=1, max_attempts=1).enqueue(60)
    doomed = crash.using(max_attempts=1).enqueue()
    uses_db = record.enqueue(note="through the app's database", seconds=1)

    worker = start_api_worker("--concurrency", "2")
    try:
        wait_for(lambda: state_of(uses_db) == "running", timeout=30)
        assert jobs_database_sessions_of(worker) == []
        jobs = (ok, flaky, slow, doomed, uses_db)
        wait_for(lambda: all(state_of(j) in ("done", "error") for j in jobs), timeout=45)
        assert jobs_database_sessions_of(worker) == []
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output

    ok.refresh_from_db()
    assert ok.state == "done" and ok.result == {"args": [1, "a"], "kwargs": {"flag": True}}
    flaky.refresh_from_db()
    assert (flaky.state, flaky.result, flaky.attempt) == ("done", 2, 2)
    assert [a.outcome for a in flaky.attempts.order_by("number")] == ["error", "done"]
    assert "attempt 1 fails on purpose" in flaky.attempts.order_by("number")[0].error
    slow.refresh_from_db()
    assert (slow.state, slow.attempt) == ("error", 1)
    assert slow.attempts.get().outcome == "timeout"
    doomed.refresh_from_db()
    assert (doomed.state, doomed.attempt) == ("error", 1)
    assert doomed.attempts.get().outcome == "crashed"
    uses_db.refresh_from_db()
    assert uses_db.state == "done"
    assert Execution.objects.filter(job_id=uses_db.pk, note="through the app's database").exists()
    assert f"job {ok.pk} done" in worker.output


def test_cancelling_a_job_an_api_worker_runs_stops_it_within_a_heartbeat(
    start_api_worker: Callable[..., WorkerProcess],
) -> None:
    job = sleep.using(max_attempts=3).enqueue(60)
    worker = start_api_worker()
    try:
        wait_for(lambda: state_of(job) == "running", timeout=30)
        assert job.cancel() == "running"
        wait_for(lambda: state_of(job) == "cancelled", timeout=10)
        assert (job.attempt, job.attempts.get().outcome) == (1, "cancelled")
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output


def test_sigterm_releases_a_long_job_of_an_api_worker_without_using_up_an_attempt(
    start_api_worker: Callable[..., WorkerProcess],
) -> None:
    job = sleep.using(max_attempts=1).enqueue(60)
    worker = start_api_worker("--grace", "1")
    wait_for(lambda: state_of(job) == "running", timeout=30)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    # --grace 1, then the job's SIGTERM (the kill grace, 1 s, at most); a worker that waited
    # for the job would wait its 60 s.
    assert time.monotonic() - started < 1 + 1 + BUSY_MACHINE_MARGIN
    job.refresh_from_db()
    assert (job.state, job.attempt, job.worker_id) == ("pending", 0, None)
    assert job.attempts.get().outcome == "released"


def test_sigterm_stops_an_idle_api_worker_within_its_long_poll(
    start_api_worker: Callable[..., WorkerProcess],
) -> None:
    # A heartbeat every 30 s: the claim long-polls for the whole --api-wait, and a worker that
    # stopped only at its next heartbeat would stop 30 s later.
    worker = start_api_worker("--api-wait", "3", env={"JOBS_HEARTBEAT_INTERVAL": "30"})
    wait_for(lambda: Worker.objects.filter(id__contains=worker.name).exists(), timeout=30)
    time.sleep(1)  # the scenario: well into a long poll
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output
    assert time.monotonic() - started < 3 + BUSY_MACHINE_MARGIN  # the wait at most
    # A job enqueued now was not claimed by the stopping worker.
    job = echo.enqueue()
    assert state_of(job) == "pending"


def test_a_refused_token_stops_the_worker_at_start_with_what_to_do(
    start_worker: Callable[..., WorkerProcess], api_url: str, tmp_path: Path
) -> None:
    bad = tmp_path / "token"
    bad.write_text("not-a-token")
    worker = start_worker("--api", api_url, "--token-file", str(bad))
    assert worker.wait(timeout=60) != 0
    assert "the worker cannot start" in worker.output and "401" in worker.output
    assert "createjobtoken" in worker.output


def test_an_api_worker_waits_out_an_api_outage_and_then_records_the_finish(
    start_api_worker: Callable[..., WorkerProcess], api_server: ApiServer
) -> None:
    job = sleep.using(max_attempts=1).enqueue(2)
    # A worker timeout the outage stays well within: the job is not stopped by its executor's
    # fence (docs/reaping.md) and ends by itself while the API is away.
    worker = start_api_worker(env={"JOBS_WORKER_TIMEOUT": "30"})
    try:
        wait_for(lambda: state_of(job) == "running", timeout=30)
        api_server.stop()
        time.sleep(3)  # the scenario: the job ends while the API is away
        assert state_of(job) == "running"
        api_server.start()
        wait_for(lambda: state_of(job) == "done", timeout=30)
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output
    assert (job.attempt, job.attempts.get().outcome) == (1, "done")
    assert "API unreachable during" in worker.output
    assert "API reachable again" in worker.output


def test_a_job_on_an_api_worker_asks_the_api_whether_it_is_cancelled_and_spawns_through_it(
    start_api_worker: Callable[..., WorkerProcess],
) -> None:
    asks = asks_if_cancelled.enqueue()
    parent = spawner.enqueue(2, 0)
    worker = start_api_worker("--concurrency", "2")
    try:
        wait_for(lambda: state_of(parent) == "done" and state_of(asks) == "done", timeout=45)
        assert jobs_database_sessions_of(worker) == []
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output
    asks.refresh_from_db()
    assert asks.result is False
    parent.refresh_from_db()
    assert parent.result == "spawned all"
    children = Job.objects.filter(parent_id=parent.pk)
    assert sorted(c.args[0] for c in children) == ["child 0", "child 1"]
    assert {c.state for c in children} == {"done"}


def test_an_api_workers_captured_log_is_stored_as_a_database_workers_is(
    start_api_worker: Callable[..., WorkerProcess],
) -> None:
    job = chatty.enqueue(20_000, line_bytes=100)  # 2 MB: the worker sends its 64 KiB tail
    worker = start_api_worker("--burst")
    assert worker.wait(timeout=60) == 0, worker.output
    log = Attempt.objects.get(job=job).log
    # Cut once, by the worker, and not again by the server: the worker's count is kept.
    cut = int(log.split(" earlier bytes cut", 1)[0].removeprefix("[… ").replace(",", ""))
    assert log.startswith("[… ") and cut > 1_900_000
    assert len(log.encode()) <= 64 * 1024 + 100 and "line 19999." in log
    assert "password=********" in log and "token=********" in log
    assert "hunter2" not in log and "abc123" not in log


def notes(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_api_workers_job_resumes_from_the_steps_and_cursor_its_failed_attempt_recorded(
    start_api_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    steps_log, cursor_log = tmp_path / "steps.jsonl", tmp_path / "cursor.jsonl"
    stepped = five_steps.enqueue(str(steps_log), fail_in=3)
    looped = step_then_cursor.enqueue(str(cursor_log), items=6, fail_at=3)
    worker = start_api_worker("--concurrency", "2")
    try:
        wait_for(lambda: state_of(stepped) == "done" and state_of(looped) == "done", timeout=60)
        assert jobs_database_sessions_of(worker) == []
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output

    # Attempt 1 recorded steps 1 and 2 through the API and failed in step 3; attempt 2 got them
    # back with its claim and ran only steps 3 to 5.
    stepped.refresh_from_db()
    assert (stepped.attempt, stepped.result) == (2, [10, 20, 30, 40, 50])
    ran = [(note["step"], note["attempt"]) for note in notes(steps_log)]
    assert ran == [(1, 1), (2, 1), (3, 1), (3, 2), (4, 2), (5, 2)]
    recorded = Step.objects.filter(job_id=stepped.pk).order_by("id")
    assert [(s.name, s.attempt, s.result) for s in recorded] == [
        ("step 1", 1, 10), ("step 2", 1, 20), ("step 3", 2, 30), ("step 4", 2, 40),
        ("step 5", 2, 50),
    ]  # fmt: skip

    # Attempt 1 planned, saved its cursor after items 0 to 2 and failed at item 3; attempt 2
    # replayed the plan and went on from item 3.
    looped.refresh_from_db()
    assert (looped.attempt, looped.result) == (2, {"items": 6, "resumed_at": 3})
    ran = [(note.get("step", note.get("item")), note["attempt"]) for note in notes(cursor_log)]
    assert ran == [("plan", 1), (0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (4, 2), (5, 2)]
    assert looped.cursors is not None
    assert (looped.cursors["next"]["value"], looped.cursors["next"]["attempt"]) == (6, 2)
    assert [a.outcome for a in looped.attempts.order_by("number")] == ["error", "done"]


# Long jobs (README: "Workers of the HTTP API get the steps and cursors with the claim and record
# them with v1/jobs/<id>/steps and v1/jobs/<id>/cursor").


def test_an_api_worker_records_steps_and_a_retry_resumes_from_the_failed_one(
    start_api_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    path = tmp_path / "steps.jsonl"
    job = five_steps.enqueue(str(path), fail_in=3)
    worker = start_api_worker()
    try:
        wait_for(lambda: state_of(job) in ("done", "error"), timeout=30)
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output
    assert (job.state, job.result) == ("done", [10, 20, 30, 40, 50]), (job.error, worker.output)
    assert job.attempt == 2
    assert Counter(line["step"] for line in journal(path)) == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}
    assert Step.objects.filter(job_id=job.pk).count() == 5


def test_an_api_workers_cursor_saves_are_written(
    start_api_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    job = cursor_loop.enqueue(str(tmp_path / "items.jsonl"), items=5, pause=0.01)
    worker = start_api_worker("--burst")
    assert worker.wait() == 0, worker.output
    job.refresh_from_db()
    assert job.state == "done", (job.error, worker.output)
    assert job.cursors is not None and job.cursors["next"]["value"] == 5, job.cursors


def test_an_api_workers_runs_are_traced_as_a_database_workers(
    start_api_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    # The claim's answer carries the job's trace context; a child spawned over the API carries
    # the run's, which the worker's client sends as W3C headers.
    from opentelemetry.sdk.trace import TracerProvider

    from testproject.testjobs import spans

    path = tmp_path / "spans.jsonl"
    with TracerProvider().get_tracer("tests").start_as_current_span("request") as request:
        parent = tree.enqueue(1)

    worker = start_api_worker("--burst", env={spans.VARIABLE: str(path)})

    assert worker.wait() == 0, worker.output
    runs = {
        span["attributes"]["django_jobs.job.id"]: span
        for span in spans.read(str(path))
        if span["name"].startswith("run ")
    }
    context = request.get_span_context()
    assert runs[parent.pk]["links"] == [
        {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
    ]
    parent_run = {key: runs[parent.pk][key] for key in ("trace_id", "span_id")}
    children = Job.objects.filter(parent_id=parent.pk)
    assert sorted(child.task for child in children) == ["tests.noop", "tests.tree"]
    assert all(runs[child.pk]["links"] == [parent_run] for child in children)
    assert all(run["attributes"]["django_jobs.job.outcome"] == "done" for run in runs.values())
