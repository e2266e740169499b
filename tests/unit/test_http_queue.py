"""The queue over the HTTP API, against a scripted server in a thread: what each call of the
Queue protocol sends, and what it makes of each answer (the real server: tests/system/
test_api_worker.py)."""

from __future__ import annotations

import ast
import inspect
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from django_jobs.apiclient import Api, read_token
from django_jobs.exceptions import ApiRefused, ApiUnreachable, InvalidOption
from django_jobs.progress import Progress
from django_jobs.store import Lease, WorkerInfo
from django_jobs.store.connection import is_connection_fatal
from django_jobs.worker.http_queue import HttpQueue

LEASE = Lease(7, 2, "w:1:abc", "opaque-lease")


class ScriptedApi:
    """An HTTP server that answers each POST with the next (status, body) of ``answers`` and
    keeps what it was sent."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, Any]] = []
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.close_after_answer = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append((self.path, dict(self.headers), body))
                status, answer = api.answers.pop(0)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = api.close_after_answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jobs/api/"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def sent(self) -> tuple[str, Any]:
        path, _, body = self.requests[-1]
        return path, body


@pytest.fixture
def api() -> Iterator[ScriptedApi]:
    scripted = ScriptedApi()
    yield scripted
    scripted.server.shutdown()
    scripted.server.server_close()


@pytest.fixture
def queue(api: ScriptedApi) -> Iterator[HttpQueue]:
    http_queue = HttpQueue(Api(api.url, "secret-token"), ["tests.echo", "tests.sleep"])
    yield http_queue
    http_queue.close()


def test_a_claim_asks_for_the_workers_tasks_and_queues_and_maps_the_job(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    job = {
        "id": 7,
        "task": "tests.echo",
        "queue": "default",
        "args": [1, "a"],
        "kwargs": {"flag": True},
        "attempt": 2,
        "max_attempts": 3,
        "timeout": 60,
        "parent_id": None,
        "lease": "opaque-lease",
    }
    api.answers = [(200, {"job": job}), (204, None)]

    claimed = queue.claim("w:1:abc", ["default"], ["tests.sleep"], wait=4.5)

    path, headers, body = api.requests[0]
    assert path == "/jobs/api/v1/claim"
    assert headers["Authorization"] == "Bearer secret-token"
    assert body == {
        "worker": "w:1:abc",
        "queues": ["default"],
        "tasks": ["tests.echo"],
        "wait": 4.5,
    }
    assert claimed is not None
    assert claimed.lease == LEASE
    assert (claimed.task, claimed.queue, claimed.max_attempts, claimed.timeout) == (
        "tests.echo",
        "default",
        3,
        60,
    )
    assert json.loads(claimed.args_json) == [1, "a"]
    assert json.loads(claimed.kwargs_json) == {"flag": True}
    # Every queue the token holds: no "queues"; nothing ready within the wait: None.
    assert queue.claim("w:1:abc", [], []) is None
    assert "queues" not in api.sent()[1] and api.sent()[1]["wait"] == 0.0


def test_a_finish_sends_the_outcome_and_the_retry_policy(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    api.answers = [(200, {"state": "done"}), (200, {"state": "pending"})]

    ended = queue.finish(LEASE, "done", result_json='{"a": [1, 2]}', error="", traceback="")
    assert api.sent() == (
        "/jobs/api/v1/jobs/7/finish",
        {
            "lease": "opaque-lease",
            "outcome": "done",
            "result": {"a": [1, 2]},
            "error": "",
            "traceback": "",
            "retry": True,
            "retry_after": 0.0,
        },
    )
    assert ended is not None and ended.state == "done" and not ended.needs_settling

    ended = queue.finish(
        LEASE, "error", error="ValueError: x", traceback="Tb", retryable=True, retry_delay=2.5
    )
    body = api.sent()[1]
    assert "result" not in body
    assert (body["outcome"], body["error"], body["retry"], body["retry_after"]) == (
        "error",
        "ValueError: x",
        True,
        2.5,
    )
    assert ended is not None and ended.state == "pending"


JOB = {
    "id": 8, "task": "tests.echo", "queue": "default", "args": [], "kwargs": {}, "attempt": 1,
    "max_attempts": 3, "timeout": None, "parent_id": None, "lease": "next-lease",
}  # fmt: skip


def test_a_finish_and_claim_is_one_request_whose_answer_holds_the_next_job(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    api.answers = [(200, {"state": "done", "job": JOB}), (200, {"state": "done", "job": None})]

    ended, claimed = queue.finish_and_claim(LEASE, "done", ["default"], ["tests.sleep"])

    path, body = api.sent()
    assert path == "/jobs/api/v1/jobs/7/finish" and len(api.requests) == 1
    assert body["claim_next"] == {"queues": ["default"], "tasks": ["tests.echo"]}
    assert (body["lease"], body["outcome"]) == ("opaque-lease", "done")
    assert ended is not None and ended.state == "done"
    assert claimed is not None and claimed.lease == Lease(8, 1, "w:1:abc", "next-lease")
    # Nothing ready: no job, and no second request; every queue of the token: no "queues".
    assert queue.finish_and_claim(LEASE, "done", [], [])[1] is None
    assert len(api.requests) == 2 and api.sent()[1]["claim_next"] == {
        "tasks": ["tests.echo", "tests.sleep"]
    }


def test_a_claimed_job_resumes_from_the_steps_and_cursors_of_the_claims_answer(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    steps = {"fetch": {"rows": [1, 2]}, "none": None}
    resumed = {**JOB, "steps": steps, "cursors": {"page": 3}}
    api.answers = [
        (200, {"job": resumed}),
        (200, {"state": "done", "job": resumed}),
        (200, {"job": JOB}),
    ]

    claimed = queue.claim("w:1:abc", [], [])
    _, nxt = queue.finish_and_claim(LEASE, "done", [], [])
    old_server = queue.claim("w:1:abc", [], [])

    for job in (claimed, nxt):
        assert job is not None and job.checkpoint is not None
        assert job.checkpoint.decoded() == {"steps": steps, "cursors": {"page": 3}}
    # A server that sends no steps and no cursors: the run reads none (and asks no one).
    assert old_server is not None and old_server.checkpoint is None


def test_a_finish_and_claim_whose_lease_is_lost_claims_nothing(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    api.answers = [(409, {"error": "lease lost", "field": "lease"})]
    assert queue.finish_and_claim(LEASE, "done", ["default"], []) == (None, None)
    assert len(api.requests) == 1


def test_a_refused_finish_and_claim_is_sent_again_as_a_finish_then_a_claim(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    refused = (403, {"error": "this token does not hold queue 'x'", "field": "claim_next.queues"})
    api.answers = [refused, (200, {"state": "done"}), (200, {"job": JOB})]

    ended, claimed = queue.finish_and_claim(LEASE, "done", ["x"], [])

    assert [path for path, _, _ in api.requests] == [
        "/jobs/api/v1/jobs/7/finish", "/jobs/api/v1/jobs/7/finish", "/jobs/api/v1/claim"
    ]  # fmt: skip
    assert "claim_next" not in api.requests[1][2]
    assert ended is not None and ended.state == "done" and claimed is not None


def test_a_server_without_claim_next_gets_a_claim_of_its_own(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    # An older server ignores the field, and answers the finish alone.
    api.answers = [(200, {"state": "done"}), (204, None)]
    ended, claimed = queue.finish_and_claim(LEASE, "done", ["default"], [])
    assert ended is not None and ended.state == "done" and claimed is None
    assert api.sent()[0] == "/jobs/api/v1/claim" and len(api.requests) == 2


def test_a_lost_lease_or_a_deleted_job_changes_nothing_and_raises_nothing(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    lost = (409, {"error": "lease lost", "field": "lease"})
    api.answers = [lost, lost, lost, (404, {"error": "no such job", "field": None}), lost]

    assert queue.finish(LEASE, "done") is None
    assert queue.release(LEASE, "released at worker shutdown") is False
    assert queue.record_live(LEASE, Progress(7, 1, 2, "half"), "log") == (False, False)
    assert queue.attempt_outcome(LEASE) is None
    assert (
        queue.hand_back(LEASE, "tests.echo", give_up_after=60, worker_timeout=60, seen_since=None)
        is None
    )


def test_progress_release_and_outcome_are_sent_with_the_lease(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    api.answers = [
        (200, {"progress": True, "log": False}),
        (200, {"released": True}),
        (200, {"outcome": "done"}),
    ]
    assert queue.record_live(LEASE, Progress(7, 3, None, "three"), None) == (True, False)
    assert api.sent() == (
        "/jobs/api/v1/jobs/7/progress",
        {
            "lease": "opaque-lease",
            "progress": {"done": 3, "total": None, "message": "three"},
            "log": None,
        },
    )
    assert queue.release(LEASE, "why") is True
    assert api.sent() == ("/jobs/api/v1/jobs/7/release", {"lease": "opaque-lease", "reason": "why"})
    assert queue.attempt_outcome(LEASE) == "done"


def test_a_heartbeat_reports_leases_by_their_token_and_orphans_as_leases(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    worker = WorkerInfo("w:1:abc", "w", "host", 1, ["default"], 2, "", ["tests.echo"])
    api.answers = [
        (
            200,
            {
                "leases": {"opaque-lease": {"job_id": 7, "held": True, "cancel_requested": True}},
                "orphans": [{"job_id": 9, "attempt": 1, "lease": "other"}],
            },
        )
    ]
    beat = queue.heartbeat(worker, [LEASE], [8])

    path, body = api.sent()
    assert path == "/jobs/api/v1/heartbeat"
    assert body["worker"] == "w:1:abc" and body["leases"] == ["opaque-lease"]
    assert body["unwritten"] == [8] and body["info"]["concurrency"] == 2
    status = beat.leases["opaque-lease"]
    assert (status.job_id, status.held, status.cancel_requested) == (7, True, True)
    assert beat.orphans == [Lease(9, 1, "w:1:abc", "other")]


def test_a_refused_token_raises_a_clear_error_and_is_no_outage(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    api.answers = [(401, {"error": "invalid token", "field": None})]
    with pytest.raises(
        ApiRefused, match=r"refused v1/claim \(401\): invalid token.*createjobtoken"
    ):
        queue.claim("w:1:abc", [], [])
    assert not queue.broken


def test_a_rate_limited_address_waits_and_tries_again_as_in_an_outage(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    api.answers = [(429, {"error": "too many requests", "field": None})]
    with pytest.raises(ApiUnreachable, match=r"answered 429 to v1/claim: too many requests"):
        queue.claim("w:1:abc", [], [])


def test_server_errors_and_no_server_are_outages(api: ScriptedApi, queue: HttpQueue) -> None:
    api.answers = [(503, {"error": "down", "field": None})]
    with pytest.raises(ApiUnreachable) as raised:
        queue.claim("w:1:abc", [], [])
    assert is_connection_fatal(raised.value)
    assert queue.trouble(raised.value) == "API unreachable"

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    nobody = HttpQueue(Api(f"http://127.0.0.1:{port}/jobs/api/", "t"), [])
    with pytest.raises(ApiUnreachable, match="API unreachable at"):
        nobody.claim("w:1:abc", [], [])
    assert nobody.broken


@pytest.mark.parametrize("status", [400, 401, 403, 405, 413])
def test_a_refusal_is_final_and_not_an_outage(
    api: ScriptedApi, queue: HttpQueue, status: int
) -> None:
    api.answers = [(status, {"error": "log contains a NUL character", "field": "log"})]
    with pytest.raises(ApiRefused, match=rf"\({status}\): log contains a NUL.*\(field log\)"):
        queue.release(LEASE, "bye")
    assert len(api.requests) == 1 and not queue.broken


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_a_server_that_asks_to_try_again_later_is_an_outage(
    api: ScriptedApi, queue: HttpQueue, status: int
) -> None:
    api.answers = [(status, {"error": "slow down", "field": None})]
    with pytest.raises(ApiUnreachable) as raised:
        queue.release(LEASE, "bye")
    assert is_connection_fatal(raised.value)


def test_a_connection_the_server_closed_while_idle_is_opened_again(
    api: ScriptedApi, queue: HttpQueue
) -> None:
    # As uvicorn does with a kept-alive connection idle for 5 s: closed without a word.
    api.close_after_answer = True
    api.answers = [(200, {"released": True}), (200, {"released": True})]
    assert queue.release(LEASE, "one")
    assert queue.release(LEASE, "two")
    assert [body["reason"] for _, _, body in api.requests] == ["one", "two"]
    assert not queue.broken


def test_the_token_comes_from_its_file_or_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  abc123\n")
    assert read_token(str(token_file), {}) == "abc123"
    assert read_token(None, {"DJANGO_JOBS_API_TOKEN": " xyz \n"}) == "xyz"
    with pytest.raises(InvalidOption, match="give --token-file PATH, or set DJANGO_JOBS_API_TOKEN"):
        read_token(None, {})
    with pytest.raises(InvalidOption, match="cannot read the API token from"):
        read_token(str(tmp_path / "missing"), {})
    token_file.write_text("\n")
    with pytest.raises(InvalidOption, match="is empty"):
        read_token(str(token_file), {})
    with pytest.raises(InvalidOption, match="http:// or https://"):
        Api("app/jobs/api/", "t")


def imported_modules(path: Path) -> set[str]:
    """Every module the file at ``path`` imports, wherever the import is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_http_queue_needs_none_of_a_database_workers_features() -> None:
    # A worker of the API has no database: settling, recovery and schedules are the server's.
    source = Path(inspect.getfile(HttpQueue))
    imported = imported_modules(source)
    features = {"django_jobs.workflows", "django_jobs.schedules", "django_jobs.reaper"}
    leaks = sorted(
        name for name in imported if any(name == f or name.startswith(f"{f}.") for f in features)
    )
    assert not leaks, f"{source.name} imports {', '.join(leaks)}"
