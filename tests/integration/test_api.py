"""The HTTP API, in process: every endpoint, its auth and scopes, each 4xx (with nothing
written), fencing of late writes, and the reaper over a silent API worker.

The views run their statements in the API's pool threads, on connections of their own: the
tests commit (``transaction=True``) so that those connections see the rows.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from django_jobs import conf
from django_jobs.api.waiting import dispatcher
from django_jobs.models import ApiToken, Attempt, Job, Worker
from django_jobs.reaper import reap_pass
from django_jobs.registry import registry
from django_jobs.tokens import auth
from testproject.testjobs.jobs import echo
from tests.conftest import connect
from tests.integration.helpers import Api, claimed, make_token
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]


@pytest.fixture
def api() -> Api:
    return Api(make_token(can_enqueue=True))


# ---------------------------------------------------------------------- a job's life


def test_a_job_is_enqueued_claimed_heartbeaten_reported_and_finished(api: Api) -> None:
    created = api.post("enqueue", {"task": "remote.upper", "args": ["hi"], "kwargs": {"x": 1}})
    assert created.status_code == 201
    assert created.data["job"] | {"id": 0} == {
        "id": 0, "task": "remote.upper", "queue": "remote", "state": "pending"
    }  # fmt: skip
    job = claimed(api, queues=["remote"], tasks=["remote.upper"])
    assert (job["id"], job["task"], job["args"], job["kwargs"]) == (
        created.data["job"]["id"], "remote.upper", ["hi"], {"x": 1}
    )  # fmt: skip
    assert (job["attempt"], job["max_attempts"], job["timeout"]) == (1, 3, 60)
    row = Job.objects.get(pk=job["id"])
    assert row.state == "running" and row.worker_id.startswith("api:t") and row.attempt == 1
    assert Worker.objects.filter(pk=row.worker_id).exists()  # the reaper knows the worker

    beat = api.job(job["id"], "heartbeat", job["lease"])
    assert (beat.status_code, beat.data) == (200, {"cancel_requested": False})
    report = api.job(job["id"], "progress", job["lease"], progress={"done": 3, "total": 4},
                     log="line one\n")  # fmt: skip
    assert (report.status_code, report.data) == (200, {"progress": True, "log": True})
    assert api.job(job["id"], "outcome", job["lease"]).data == {"outcome": "running"}

    done = api.job(job["id"], "finish", job["lease"], outcome="done", result={"up": "HI"})
    assert (done.status_code, done.data) == (200, {"state": "done"})
    row.refresh_from_db()
    assert (row.state, row.result, row.progress_done) == ("done", {"up": "HI"}, 3)
    assert Attempt.objects.get(job=row).log == "line one\n"
    assert api.job(job["id"], "outcome", job["lease"]).data == {"outcome": "done"}


def test_a_failed_attempt_is_retried_or_ends_in_error(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    failed = api.job(job_id, "finish", job["lease"], outcome="error", error="boom",
                     traceback="Traceback: boom", retry_after=0)  # fmt: skip
    assert Job.objects.get(pk=job_id).max_attempts == 3
    assert failed.data == {"state": "pending"}
    again = claimed(api, queues=["remote"])
    assert (again["id"], again["attempt"]) == (job_id, 2)
    # Without retry_after, the retry waits the task's backoff, as on any worker.
    backed_off = api.job(job_id, "finish", again["lease"], outcome="error", error="again")
    assert backed_off.data == {"state": "pending"}
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after > now() FROM django_jobs_job WHERE id = %s", [job_id])
        assert cursor.fetchone() == (True,)
    assert api.claim(queues=["remote"]).status_code == 204
    Job.objects.filter(pk=job_id).update(run_after=timezone.now())
    again = claimed(api, queues=["remote"])
    assert again["attempt"] == 3
    final = api.job(job_id, "finish", again["lease"], outcome="error", error="bad", retry=False)
    assert final.data == {"state": "error"}
    row = Job.objects.get(pk=job_id)
    assert (row.state, row.error) == ("error", "bad")
    assert Attempt.objects.filter(job=row).order_by("number")[0].traceback == "Traceback: boom"


def test_a_released_job_goes_back_without_using_an_attempt(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    assert api.job(job_id, "release", job["lease"]).data == {"released": True}
    row = Job.objects.get(pk=job_id)
    assert (row.state, row.attempt) == ("pending", 0)
    assert claimed(api, queues=["remote"])["attempt"] == 1


def test_a_cancel_request_reaches_the_heartbeat(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    Job.objects.get(pk=job_id).cancel()
    assert api.job(job_id, "heartbeat", job["lease"]).data == {"cancel_requested": True}
    ended = api.job(job_id, "finish", job["lease"], outcome="cancelled", error="stopped")
    assert ended.data == {"state": "cancelled"}


# ---------------------------------------------------------------------- text sent by workers

SECRET_LOG = "connecting\nlogin with password=hunter2 to postgres://app:pw-secret@db/app\n"


def test_a_log_sent_by_a_worker_is_stored_masked(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    report = api.job(job_id, "progress", job["lease"], log=SECRET_LOG,
                     progress={"done": 1, "message": "as api_key=sk-live-123"})  # fmt: skip
    assert report.status_code == 200
    assert Attempt.objects.get(job_id=job_id).log == (
        "connecting\nlogin with password=******** to postgres://app:********@db/app\n"
    )
    assert Job.objects.get(pk=job_id).progress_message == "as api_key=********"


def test_a_log_sent_by_a_worker_keeps_its_last_attempt_log_bytes_from_a_line_start(
    api: Api,
) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    # 700 KB, the cut falling in a long line right after "password=": its bare end must go.
    lines = [f"line {i:06d} " + "x" * 88 + "\n" for i in range(6_200)]
    log = "".join(lines) + "y" * 25_000 + " password=" + "hunter2" + "z" * 50_000 + "\nlast\n"
    assert len(log) > 700_000
    assert api.job(job_id, "progress", job["lease"], log=log).status_code == 200
    stored = Attempt.objects.get(job_id=job_id).log
    marker, kept = stored.split("\n", 1)
    cut = len(log) - len("last\n")
    assert marker == f"[… {cut:,} earlier bytes cut: the last {64 * 1024:,} are kept …]"
    assert kept == "last\n" and "hunter2" not in stored
    with override_settings(JOBS_ATTEMPT_LOG_BYTES=1000):
        assert api.job(job_id, "progress", job["lease"], log="".join(lines)).status_code == 200
    stored = Attempt.objects.get(job_id=job_id).log
    assert stored.endswith("line 006199 " + "x" * 88 + "\n")
    kept = stored.split("\n", 1)[1]
    assert kept.startswith("line ") and len(kept.encode()) <= 1000


def test_errors_tracebacks_and_release_reasons_sent_by_a_worker_are_stored_masked(
    api: Api,
) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    released = api.job(job_id, "release", job["lease"], reason="rotating token=tok-zzz")
    assert released.data == {"released": True}
    assert Attempt.objects.get(job_id=job_id).error == "rotating token=********"
    job = claimed(api, queues=["remote"])
    failed = api.job(job_id, "finish", job["lease"], outcome="error", retry=False,
                     error="login failed password=hunter2",
                     traceback="x" * 30_000 + '\n  connect(password="hunter2")\n')  # fmt: skip
    assert failed.data == {"state": "error"}
    attempt = Attempt.objects.get(job_id=job_id, number=1, outcome="error")
    assert attempt.error == Job.objects.get(pk=job_id).error == "login failed password=********"
    assert attempt.traceback.endswith("connect(password=********)\n")
    assert len(attempt.traceback) == 20_000


def test_a_job_spawns_children_and_waits_for_them(api: Api) -> None:
    parent_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    child = api.job(parent_id, "spawn", job["lease"], task="remote.upper", args=["c"],
                    options={"priority": 5})  # fmt: skip
    assert child.status_code == 201
    child_row = Job.objects.get(pk=child.data["job"]["id"])
    assert (child_row.parent_id, child_row.priority, child_row.args) == (parent_id, 5, ["c"])
    assert api.job(parent_id, "finish", job["lease"], outcome="done").data == {"state": "waiting"}
    child_job = claimed(api, queues=["remote"])
    assert child_job["parent_id"] == parent_id
    assert api.job(child_job["id"], "finish", child_job["lease"], outcome="done").status_code == 200
    assert Job.objects.get(pk=parent_id).state == "done"  # settled by the child's finish


def test_the_batch_heartbeat_reports_leases_and_orphans(api: Api) -> None:
    first = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    second = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    one = claimed(api, worker="pod-a", queues=["remote"])
    two = claimed(api, worker="pod-a", queues=["remote"])  # its reply was "lost"
    assert {one["id"], two["id"]} == {first, second}
    beat = api.post("heartbeat", {"worker": "pod-a", "leases": [one["lease"]],
                                  "info": {"concurrency": 2, "pid": 7}})  # fmt: skip
    assert beat.status_code == 200
    assert beat.data["leases"] == {
        one["lease"]: {"job_id": one["id"], "held": True, "cancel_requested": False}
    }
    assert beat.data["orphans"] == [{"job_id": two["id"], "attempt": 1, "lease": two["lease"]}]
    assert api.job(two["id"], "release", beat.data["orphans"][0]["lease"]).status_code == 200
    # A worker's first heartbeat registers what it says of itself.
    api.post("heartbeat", {"worker": "pod-b", "info": {"concurrency": 2, "pid": 7}})
    worker = Worker.objects.get(pk=Job.objects.get(pk=first).worker_id.replace("pod-a", "pod-b"))
    assert (worker.concurrency, worker.pid) == (2, 7)


def test_enqueue_takes_options_and_a_unique_key(api: Api) -> None:
    body = {"task": "tests.echo", "args": [1], "unique_key": "once",
            "options": {"priority": 9, "delay": 3600, "max_attempts": 1}}  # fmt: skip
    first = api.post("enqueue", body)
    assert first.status_code == 201
    assert api.post("enqueue", body).data["job"]["id"] == first.data["job"]["id"]
    row = Job.objects.get(pk=first.data["job"]["id"])
    assert (row.priority, row.max_attempts, row.unique_key) == (9, 1, "once")
    assert row.run_after is not None and Job.objects.count() == 1


# ---------------------------------------------------------------------- long polling


def test_a_long_poll_returns_the_job_enqueued_while_it_waits(api: Api) -> None:
    answers: list[Any] = []
    waiting = threading.Thread(target=lambda: answers.append(api.claim(queues=["remote"], wait=10)))
    waiting.start()
    deadline = time.monotonic() + 5
    while dispatcher.waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    enqueued = time.monotonic()
    Api(api.token).post("enqueue", {"task": "remote.upper", "args": ["late"]})
    waiting.join(10 + BUSY_MACHINE_MARGIN)
    # Woken by the enqueue's notification, or at the latest by the dispatcher's next tick
    # (JOBS_POLL_INTERVAL); a poll that was not woken answers 204 at the end of its 10 s.
    assert answers and answers[0].status_code == 200
    assert answers[0].data["job"]["args"] == ["late"]
    assert time.monotonic() - enqueued < conf.poll_interval() + BUSY_MACHINE_MARGIN


def test_a_long_poll_with_nothing_to_do_answers_204_after_its_wait(api: Api) -> None:
    started = time.monotonic()
    response = api.claim(queues=["remote"], wait=1)
    assert response.status_code == 204 and response.content == b""
    # Its 1 s, and what a busy machine adds; not JOBS_API_MAX_WAIT (30 s), not at once.
    assert 0.9 < time.monotonic() - started < 1 + BUSY_MACHINE_MARGIN


# ---------------------------------------------------------------------- refusals


def nothing_written() -> bool:
    return not Job.objects.exists() and not Worker.objects.exists()


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Bearer nope", "Basic dXNlcjpwYXNz", "Token djt_x"],
)
def test_requests_without_a_valid_token_get_401(header: str | None) -> None:
    client = Client(HTTP_HOST="localhost")
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.post("/jobs/api/v1/claim", "{}", content_type="application/json", **extra)
    assert response.status_code == 401 and "error" in json.loads(response.content)
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert nothing_written()


def test_a_revoked_token_is_refused() -> None:
    row, secret = auth.create("revoked", ["remote"])
    auth.revoke([row.pk])
    assert Api(secret).claim().status_code == 401


def test_a_token_holds_only_its_queues() -> None:
    api = Api(make_token(("remote",)))
    assert api.claim(queues=["default"]).status_code == 403
    assert api.claim(queues=["*"]).data["field"] == "queues"
    assert api.post("enqueue", {"task": "remote.upper"}).status_code == 403  # no --can-enqueue
    enqueuer = Api(make_token(("remote",), can_enqueue=True))
    refused = enqueuer.post("enqueue", {"task": "tests.echo"})  # default
    assert (refused.status_code, refused.data["field"]) == (403, "queue")
    assert nothing_written()
    # Another token cannot use a lease it did not get.
    job_id = enqueuer.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(enqueuer, queues=["remote"])
    assert api.job(job_id, "finish", job["lease"], outcome="done").status_code == 409
    assert Job.objects.get(pk=job_id).state == "running"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queues": ["remote"]}, "worker"),
        ({"worker": "has space"}, "worker"),
        ({"worker": "w", "queues": "remote"}, "queues"),
        ({"worker": "w", "queues": [""]}, "queues"),
        ({"worker": "w", "tasks": [1]}, "tasks"),
        ({"worker": "w", "wait": 31}, "wait"),
        ({"worker": "w", "wait": "soon"}, "wait"),
        ({"worker": "w", "wait": True}, "wait"),
    ],
)
def test_a_bad_claim_gets_400_naming_the_field(api: Api, body: dict[str, Any], field: str) -> None:
    response = api.post("claim", body)
    assert (response.status_code, response.data["field"]) == (400, field), response.data
    assert nothing_written()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "no.such.task"}, "task"),
        ({"task": "tests.echo", "args": {"a": 1}}, "args"),
        ({"task": "tests.echo", "kwargs": [1]}, "kwargs"),
        ({"task": "tests.echo", "args": ["x" * 300_000]}, "args"),
        ({"task": "tests.echo", "args": ["x" * 900_000]}, None),  # the body itself
        ({"task": "tests.echo", "args": ["x" * 200_000, "y" * 100_000]},
         "args"),
        ({"task": "tests.echo", "options": {"priority": 1000}},
         "options.priority"),
        ({"task": "tests.echo", "options": {"colour": "red"}}, "options"),
        ({"task": "tests.echo", "options": {"run_after": "tomorrow"}},
         "options.run_after"),
        ({"task": "tests.echo", "options": {"depends_on": [10**9]}},
         "options.depends_on"),
        ({"args": []}, "task"),
    ],
)  # fmt: skip
def test_a_bad_enqueue_gets_400_and_writes_nothing(body: dict[str, Any], field: str | None) -> None:
    api = Api(make_token(("default", "remote"), can_enqueue=True))
    response = api.post("enqueue", body)
    # A body over the limit is refused as too large; other mistakes name their field.
    assert response.status_code == (400 if field else 413), response.data
    assert response.data["field"] == field, response.data
    assert not Job.objects.exists()


def test_malformed_json_and_other_methods_are_refused(api: Api) -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        response = api.post("claim", raw=raw)
        assert (response.status_code, response.data["field"]) == (400, None)
    assert api.client.get("/jobs/api/v1/claim").status_code == 405
    assert api.client.post("/jobs/api/v1/nothing").status_code == 404
    assert nothing_written()


def test_finishing_with_a_bad_outcome_or_result_changes_nothing(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    for body, field in [
        ({"outcome": "great"}, "outcome"),
        ({}, "outcome"),
        ({"outcome": "error", "retry_after": -1}, "retry_after"),
        ({"outcome": "error", "retry": "yes"}, "retry"),
    ]:
        response = api.job(job_id, "finish", job["lease"], **body)
        assert (response.status_code, response.data["field"]) == (400, field)
    for lease in ("", "garbage", f"{job_id + 1}{job['lease'][len(str(job_id)) :]}"):
        assert api.job(job_id, "finish", lease, outcome="done").status_code in (400, 409)
    assert Job.objects.get(pk=job_id).state == "running"


# ---------------------------------------------------------------------- fencing and the reaper


def test_a_paused_workers_late_writes_change_nothing(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    old = claimed(api, worker="paused", queues=["remote"])
    # The worker stalls; its job is reaped (its registry row went silent) and run again.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_worker SET last_seen_at = now() - interval '1 hour' WHERE id = %s",
            [Job.objects.get(pk=job_id).worker_id],
        )
    assert [a.outcome for a in reap_pass().actions] == ["lost"]
    Job.objects.filter(pk=job_id).update(run_after=timezone.now())
    new = claimed(api, worker="healthy", queues=["remote"])
    assert (new["id"], new["attempt"]) == (job_id, 2)

    for action, body in [
        ("finish", {"outcome": "done", "result": "stale"}),
        ("heartbeat", {}),
        ("progress", {"progress": {"done": 1}}),
        ("release", {}),
    ]:
        response = api.job(job_id, action, old["lease"], **body)
        assert (response.status_code, response.data["field"]) == (409, "lease"), action
    spawned = api.job(job_id, "spawn", old["lease"], task="remote.upper")
    assert spawned.status_code == 409
    row = Job.objects.get(pk=job_id)
    assert (row.state, row.attempt, row.result, row.progress_done) == ("running", 2, None, None)
    assert (
        api.job(job_id, "finish", new["lease"], outcome="done", result="fresh").status_code == 200
    )
    assert Job.objects.get(pk=job_id).result == "fresh"


def test_a_silent_api_worker_loses_its_job_to_the_reaper(api: Api) -> None:
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, worker="silent", queues=["remote"])
    # It has just registered: alive by a 60 s worker timeout, however busy the machine.
    with override_settings(JOBS_WORKER_TIMEOUT=60):
        assert reap_pass().actions == []
    with override_settings(JOBS_WORKER_TIMEOUT=1.0):
        time.sleep(1.5)  # silent for longer than that (a busy machine only adds to it)
        actions = reap_pass().actions
    assert [(a.job.lease.job_id, a.outcome) for a in actions] == [(job_id, "lost")]
    assert Job.objects.get(pk=job_id).state == "pending"  # retried: attempts are left
    assert api.job(job_id, "heartbeat", job["lease"]).status_code == 409


# ---------------------------------------------------------------------- tokens and tasks


def test_createjobtoken_prints_a_token_once_and_stores_its_hash(capsys: Any) -> None:
    call_command("createjobtoken", "gpu-fleet", "--queues", "gpu,remote", "--can-enqueue")
    out, err = capsys.readouterr()
    secret = out.strip()
    row = ApiToken.objects.get(name="gpu-fleet")
    assert secret.startswith("djt_") and secret not in row.token_hash and "shown only now" in err
    assert (row.queues, row.can_enqueue, row.token_hash) == (
        ["gpu", "remote"], True, auth.digest(secret)
    )  # fmt: skip
    assert Api(secret).claim(queues=["gpu"]).status_code == 204
    with pytest.raises(Exception, match="exists already"):
        call_command("createjobtoken", "gpu-fleet", "--queues", "gpu")
    with pytest.raises(Exception, match="not a token name"):
        call_command("createjobtoken", "no spaces", "--queues", "gpu")


def test_remote_tasks_are_enqueued_here_and_never_claimed_by_database_workers() -> None:
    assert "remote.upper" in registry.remote_names()
    assert not registry.runs_here("remote.upper") and registry.runs_here(echo.name)
    assert "remote.upper" not in registry.local_names()
    with pytest.raises(Exception, match="HTTP API"):
        registry.get("remote.upper")()


def test_the_admin_lists_tokens_and_revokes_them_only_with_the_permission(staff) -> None:
    row, secret = auth.create("fleet", ["remote"])
    assert Api(secret).claim(queues=["remote"]).status_code == 204

    url = "/admin/django_jobs/apitoken/"
    viewer = staff("view_apitoken")
    page = viewer.get(url)
    assert page.status_code == 200 and b"fleet" in page.content
    assert secret.encode() not in page.content and row.token_hash.encode() not in page.content
    assert b"revoke_tokens" not in page.content
    viewer.post(url, {"action": "revoke_tokens", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.revoked_at is None  # a forged POST without the permission changes nothing

    revoker = staff("view_apitoken", "revoke_apitoken")
    assert b"revoke_tokens" in revoker.get(url).content
    revoker.post(url, {"action": "revoke_tokens", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.revoked_at is not None
    auth.cache.forget()  # past the cache's 10 seconds
    assert Api(secret).claim(queues=["remote"]).status_code == 401


@override_settings(JOBS_LOCK_TIMEOUT_MS=300)
def test_a_lock_held_on_the_token_table_makes_the_api_answer_503_at_once() -> None:
    api = Api(make_token())
    holder = connect()
    # As a migration would: ACCESS EXCLUSIVE on the token table, in a transaction left open (and
    # ended after 10 s, so that a lookup that waits for it shows as slow rather than hanging).
    holder.execute("BEGIN")
    holder.execute("LOCK TABLE django_jobs_api_token IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(10.0, holder.rollback)
    release.start()
    try:
        started = time.monotonic()
        response = api.claim(queues=["remote"])
        elapsed = time.monotonic() - started
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
    assert response.status_code == 503, (response.status_code, response.data)
    assert response.data == {"error": "the job database is unavailable; try again", "field": None}
    # The 0.3 s lock timeout; a lookup that waited for the lock would answer at the release,
    # after 10 s, and not 503.
    assert elapsed < 0.3 + BUSY_MACHINE_MARGIN
    assert api.claim(queues=["remote"]).status_code == 204  # once the lock is gone


@override_settings(JOBS_LOCK_TIMEOUT_MS=300)
def test_a_locked_token_row_leaves_its_use_unstamped_and_the_request_served() -> None:
    secret = make_token()
    api = Api(secret)
    holder = connect()
    holder.execute("BEGIN")
    holder.execute(
        "SELECT 1 FROM django_jobs_api_token WHERE token_hash = %s FOR UPDATE",
        [auth.digest(secret)],
    )
    try:
        assert api.claim(queues=["remote"]).status_code == 204
    finally:
        holder.rollback()
        holder.close()
    assert ApiToken.objects.get(token_hash=auth.digest(secret)).last_used_at is None
    auth.cache.forget()
    assert api.claim(queues=["remote"]).status_code == 204
    assert ApiToken.objects.get(token_hash=auth.digest(secret)).last_used_at is not None


def test_a_new_tokens_row_is_the_stored_one() -> None:
    row, secret = auth.create("stored", ["gpu"], can_enqueue=True, created_by="ops")
    stored = ApiToken.objects.get(pk=row.pk)
    assert (row.name, row.token_hash, row.prefix, row.queues, row.can_enqueue) == (
        "stored", auth.digest(secret), secret[:8], ["gpu"], True
    )  # fmt: skip
    assert (row.created_at, row.created_by, row.revoked_at) == (stored.created_at, "ops", None)
    row.save()  # an update of the stored row, not a second insert
    assert ApiToken.objects.filter(name="stored").count() == 1
