"""The HTTP API's scopes and leases against a hostile client: what a token may enqueue and spawn
(its queues, its tasks, the jobs it may see), leases bound whole to the token that claimed the
job, one generic 409, revocation reaching a waiting claim, expiry and the token's user.

Each test reproduces a refusal the API once lacked. Requests go through Django's test client, as
in test_api.py, whose helpers these tests share.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_jobs.api import protocol
from django_jobs.api.waiting import dispatcher
from django_jobs.models import ApiToken, Attempt, Job
from django_jobs.tokens import auth
from testproject.testjobs.jobs import echo
from tests.integration.helpers import Api, claimed, make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]

GENERIC_409 = protocol.lease_lost().body()


def forged(job: dict[str, Any], api: Api, *, worker: str = "w1", attempt: Any = None) -> str:
    """``job``'s lease, with the worker part of ``api``'s token (or another attempt)."""
    job_id, token, number, _ = job["lease"].split(".", 3)
    name = ApiToken.objects.get(token_hash=auth.digest(api.token or "")).name
    return f"{job_id}.{token}.{number if attempt is None else attempt}.api:{name}:{worker}"


# ---------------------------------------------------------------------- scopes


def test_spawn_needs_the_enqueue_scope() -> None:
    enqueuer = Api(make_token(("remote",), can_enqueue=True))
    worker = Api(make_token(("remote",)))  # claims and finishes only
    parent_id = enqueuer.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(worker, queues=["remote"])
    refused = worker.job(parent_id, "spawn", job["lease"], task="remote.upper",
                         options={"priority": 100})  # fmt: skip
    assert (refused.status_code, refused.data["field"]) == (403, None), refused.data
    assert "--can-enqueue" in refused.data["error"]
    assert Job.objects.count() == 1
    assert worker.job(parent_id, "finish", job["lease"], outcome="done").data == {"state": "done"}


def test_a_star_token_enqueues_and_spawns_only_into_declared_queues() -> None:
    api = Api(make_token(("*",), can_enqueue=True))
    # The test project declares JOBS_QUEUES = ["default", "reports", "imports"].
    for body in (
        {"task": "tests.echo", "options": {"queue": "nowhere"}},
        {"task": "remote.upper"},  # its queue, remote, is not declared
    ):
        refused = api.post("enqueue", body)
        assert (refused.status_code, refused.data["field"]) == (403, "queue"), refused.data
        assert "declare" in refused.data["error"]
    assert not Job.objects.exists()
    parent_id = api.post("enqueue", {"task": "tests.echo", "options": {"queue": "imports"}}).data[
        "job"
    ]["id"]
    job = claimed(api, queues=["imports"])
    spawned = api.job(parent_id, "spawn", job["lease"], task="tests.echo",
                      options={"queue": "nowhere"})  # fmt: skip
    assert (spawned.status_code, spawned.data["field"]) == (403, "queue")
    assert Job.objects.count() == 1
    child = api.job(parent_id, "spawn", job["lease"], task="tests.echo",
                    options={"queue": "reports"})  # fmt: skip
    assert child.status_code == 201 and child.data["job"]["queue"] == "reports"
    with override_settings(JOBS_QUEUES=["default", "nowhere"]):
        made = api.post("enqueue", {"task": "tests.echo", "options": {"queue": "nowhere"}})
        assert made.status_code == 201 and made.data["job"]["queue"] == "nowhere"


def test_options_queue_cannot_leave_the_tokens_queues() -> None:
    api = Api(make_token(("imports",), can_enqueue=True))
    refused = api.post("enqueue", {"task": "tests.echo", "options": {"queue": "default"}})
    assert (refused.status_code, refused.data["field"]) == (403, "queue")
    made = api.post("enqueue", {"task": "tests.echo", "options": {"queue": "imports"}})
    assert made.status_code == 201 and made.data["job"]["queue"] == "imports"
    job = claimed(api, queues=["imports"])
    spawned = api.job(job["id"], "spawn", job["lease"], task="tests.echo",
                      options={"queue": "remote"})  # fmt: skip
    assert (spawned.status_code, spawned.data["field"]) == (403, "queue")
    assert Job.objects.count() == 1


def test_a_token_with_tasks_enqueues_and_spawns_only_those(capsys: Any) -> None:
    call_command("createjobtoken", "only-upper", "--queues", "remote,default", "--can-enqueue",
                 "--tasks", "remote.upper")  # fmt: skip
    api = Api(capsys.readouterr().out.strip())
    assert ApiToken.objects.get(name="only-upper").tasks == ["remote.upper"]
    refused = api.post("enqueue", {"task": "tests.echo"})
    assert (refused.status_code, refused.data["field"]) == (403, "task"), refused.data
    parent_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    spawned = api.job(parent_id, "spawn", job["lease"], task="tests.echo")
    assert (spawned.status_code, spawned.data["field"]) == (403, "task")
    assert api.job(parent_id, "spawn", job["lease"], task="remote.upper").status_code == 201
    assert Job.objects.count() == 2
    with pytest.raises(CommandError, match="not a registered task"):
        call_command("createjobtoken", "typo", "--queues", "remote", "--tasks", "remote.uper")


def test_depends_on_names_only_jobs_of_the_tokens_queues() -> None:
    api = Api(make_token(("remote",), can_enqueue=True))
    other = echo.enqueue()  # a job of the default queue, which the token does not hold
    mine = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    missing = other.pk + mine + 1000
    answers = {}
    for job_id in (other.pk, missing):
        response = api.post("enqueue", {"task": "remote.upper",
                                         "options": {"depends_on": [job_id]}})  # fmt: skip
        assert response.status_code == 400, response.data
        answers[job_id] = (response.data["field"], response.data["error"].replace(str(job_id), "N"))
    assert answers[other.pk] == answers[missing]  # the same answer as a job that does not exist
    assert answers[other.pk][0] == "options.depends_on"
    assert Job.objects.count() == 2
    job = claimed(api, queues=["remote"])
    spawned = api.job(mine, "spawn", job["lease"], task="remote.upper",
                      options={"depends_on": [other.pk]})  # fmt: skip
    assert spawned.status_code == 400 and Job.objects.count() == 2
    made = api.post("enqueue", {"task": "remote.upper", "options": {"depends_on": [mine]}})
    assert made.status_code == 201 and made.data["job"]["state"] == "waiting"


# ---------------------------------------------------------------------- leases


def test_a_lease_is_bound_whole_to_the_token_that_claimed_it() -> None:
    owner = Api(make_token(("remote",), can_enqueue=True))
    thief = Api(make_token(("remote",), can_enqueue=True))
    job_id = owner.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(owner, queues=["remote"])
    ok = owner.job(job_id, "progress", job["lease"], progress={"done": 1, "total": 2}, log="mine\n")
    assert ok.data == {"progress": True, "log": True}
    stolen = forged(job, thief)
    for action, body in [
        ("progress", {"progress": {"done": 2, "total": 2}, "log": "theirs\n"}),
        ("outcome", {}),
        ("spawn", {"task": "remote.upper"}),
        ("heartbeat", {}),
        ("finish", {"outcome": "done"}),
        ("release", {}),
    ]:
        response = thief.job(job_id, action, stolen, **body)
        assert (response.status_code, response.data) == (409, GENERIC_409), action
    # The owner's own lease with another attempt number is not the lease either.
    wrong = forged(job, owner, attempt=2)
    for action, body in [("heartbeat", {}), ("progress", {"log": "x"}), ("outcome", {}),
                         ("spawn", {"task": "remote.upper"})]:  # fmt: skip
        response = owner.job(job_id, action, wrong, **body)
        assert (response.status_code, response.data) == (409, GENERIC_409), action
    # An attempt out of any range: refused (as a bad lease, or as bad input), never held.
    absurd = owner.job(job_id, "heartbeat", forged(job, owner, attempt=10**30))
    assert absurd.status_code in (400, 409), absurd.data
    row = Job.objects.get(pk=job_id)
    assert (row.state, row.progress_done, Job.objects.count()) == ("running", 1, 1)
    assert Attempt.objects.get(job_id=job_id).log == "mine\n"
    assert owner.job(job_id, "finish", job["lease"], outcome="done").data == {"state": "done"}


def test_progress_after_the_finish_keeps_the_finished_attempts_log() -> None:
    api = Api(make_token(("remote",), can_enqueue=True))
    job_id = api.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    job = claimed(api, queues=["remote"])
    api.job(job_id, "progress", job["lease"], progress={"done": 5, "total": 5}, log="final\n")
    assert api.job(job_id, "finish", job["lease"], outcome="done").data == {"state": "done"}
    late = api.job(job_id, "progress", job["lease"], progress={"done": 1}, log="replaced\n")
    assert (late.status_code, late.data) == (409, GENERIC_409)
    for action, body in [("heartbeat", {}), ("spawn", {"task": "remote.upper"}),
                         ("release", {}), ("finish", {"outcome": "error"})]:  # fmt: skip
        response = api.job(job_id, action, job["lease"], **body)
        assert (response.status_code, response.data) == (409, GENERIC_409), action
    assert Attempt.objects.get(job_id=job_id).log == "final\n"
    assert Job.objects.get(pk=job_id).progress_done == 5
    assert (Job.objects.get(pk=job_id).state, Job.objects.count()) == ("done", 1)
    # What became of the attempt can still be asked, by its own lease.
    assert api.job(job_id, "outcome", job["lease"]).data == {"outcome": "done"}


def test_spawns_409_says_nothing_about_other_jobs() -> None:
    owner = Api(make_token(("default",), can_enqueue=True))
    prober = Api(make_token(("remote",), can_enqueue=True))
    other = owner.post("enqueue", {"task": "tests.echo"}).data["job"]["id"]
    running = claimed(owner, queues=["default"])
    finished_id = prober.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    finished = claimed(prober, queues=["remote"])
    prober.job(finished_id, "finish", finished["lease"], outcome="done")
    absent = other + finished_id + 1000
    worker = forged(running, prober).split(".", 3)[3]
    probes = {
        "another queue's running job": (other, forged(running, prober)),
        "a job that does not exist": (absent, f"{absent}.{uuid.uuid4()}.1.{worker}"),
        "a finished job": (finished_id, finished["lease"]),
    }
    for what, (job_id, lease) in probes.items():
        response = prober.job(job_id, "spawn", lease, task="remote.upper")
        assert (response.status_code, response.data) == (409, GENERIC_409), what
    assert Job.objects.count() == 2


# ---------------------------------------------------------------------- revocation


def test_a_claim_waiting_when_its_token_is_revoked_gets_no_job() -> None:
    row, secret = auth.create(f"w{time.monotonic_ns()}", ["remote"])
    waiter = Api(secret)
    enqueuer = Api(make_token(("remote",), can_enqueue=True))
    answers: list[Any] = []
    polling = threading.Thread(target=lambda: answers.append(waiter.claim(queues=["remote"],
                                                                          wait=20)))  # fmt: skip
    polling.start()
    deadline = time.monotonic() + 10
    while dispatcher.waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dispatcher.waiting() == 1
    auth.revoke([row.pk])
    auth.cache.forget()  # past the cache's 10 seconds
    job_id = enqueuer.post("enqueue", {"task": "remote.upper"}).data["job"]["id"]
    polling.join(20)
    assert answers and answers[0].status_code == 401, answers
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempt, job.worker_id) == ("pending", 0, None)  # released unused
    again = claimed(enqueuer, queues=["remote"])
    assert (again["id"], again["attempt"]) == (job_id, 1)


# ---------------------------------------------------------------------- expiry and users


def test_a_token_expires(capsys: Any) -> None:
    for text, lifetime in [("90d", datetime.timedelta(days=90)),
                           ("12h", datetime.timedelta(hours=12)),
                           ("30m", datetime.timedelta(minutes=30))]:  # fmt: skip
        before = timezone.now()
        call_command("createjobtoken", f"exp-{text}", "--queues", "remote", "--expires", text)
        expires_at = ApiToken.objects.get(name=f"exp-{text}").expires_at
        assert expires_at is not None
        assert before + lifetime <= expires_at <= timezone.now() + lifetime
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    api = Api(secret)
    assert api.claim(queues=["remote"]).status_code == 204
    ApiToken.objects.filter(name="exp-30m").update(expires_at=timezone.now())
    auth.cache.forget()
    refused = api.claim(queues=["remote"])
    assert refused.status_code == 401 and "expired" in refused.data["error"], refused.data
    assert "createjobtoken" in refused.data["error"]
    for bad in ("90", "0d", "1y", "-1d", "d", "1.5h"):
        with pytest.raises(CommandError, match="lifetime"):
            call_command("createjobtoken", "bad-expiry", "--queues", "remote", f"--expires={bad}")
    assert ApiToken.objects.filter(expires_at__isnull=True).count() == 0


def test_a_cached_token_is_refused_once_it_expires() -> None:
    row, secret = auth.create("short", ["remote"], expires_in=datetime.timedelta(minutes=1))
    api = Api(secret)
    assert api.claim(queues=["remote"]).status_code == 204  # now cached
    known = auth.cache.peek(secret)
    assert isinstance(known, auth.Fresh)
    grant = known.grant
    assert grant.expires_at == row.expires_at
    assert grant.refusal(row.expires_at) is not None and grant.refusal() is None


def test_a_token_of_a_deactivated_user_is_refused(capsys: Any) -> None:
    user = User.objects.create_user("robot", password="x")
    call_command("createjobtoken", "robots", "--queues", "remote", "--user", "robot")
    secret = capsys.readouterr().out.strip()
    row = ApiToken.objects.get(name="robots")
    assert (row.user_id, row.created_by) == (user.pk, "robot")
    api = Api(secret)
    assert api.claim(queues=["remote"]).status_code == 204
    user.is_active = False
    user.save()
    auth.cache.forget()
    refused = api.claim(queues=["remote"])
    assert refused.status_code == 401 and "deactivated" in refused.data["error"], refused.data
    User.objects.filter(pk=user.pk).update(is_active=True)
    auth.cache.forget()
    assert api.claim(queues=["remote"]).status_code == 204
    with pytest.raises(CommandError, match="no user named"):
        call_command("createjobtoken", "ghosts", "--queues", "remote", "--user", "ghost")
    user.delete()  # its tokens go with it
    assert not ApiToken.objects.filter(name="robots").exists()
