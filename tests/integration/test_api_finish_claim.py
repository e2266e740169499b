"""A finish that also claims the worker's next job (``claim_next`` of v1/jobs/<id>/finish): one
request, one transaction in one round trip, as a database worker's finish_and_claim; its claim
bound as v1/claim's is (the token's queues, the claim's tasks, the queue controls), and made only
when the finish held its lease. Served both ways: Django's URL handler and ``with_api``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobs import store
from django_jobs.api import operations, protocol
from django_jobs.api.operations import registrations
from django_jobs.models import Attempt, Job, Worker
from django_jobs.queues import controls
from django_jobs.tokens import auth
from tests.integration.helpers import Answer, ServedApi, make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]


class Api(ServedApi):
    """The API of one token, through Django's URL handler or through ``with_api``."""

    def enqueue(self, **body: Any) -> int:
        answer = self.post("enqueue", {"task": "remote.upper", "args": ["x"], **body})
        assert answer.status == 201, answer
        return int(answer.data["job"]["id"])

    def claim(self, worker: str = "w1", **body: Any) -> dict[str, Any]:
        answer = self.post("claim", {"worker": worker, **body})
        assert answer.status == 200, answer
        return dict(answer.data["job"])

    def finish(self, job: dict[str, Any], **body: Any) -> Answer:
        return self.post(
            f"jobs/{job['id']}/finish", {"lease": job["lease"], "outcome": "done", **body}
        )


def token(queues: tuple[str, ...] = ("default", "remote")) -> str:
    return make_token(queues, can_enqueue=True)


@pytest.fixture(params=["django", "asgi"])
def api(request: pytest.FixtureRequest) -> Api:
    return Api(token(), request.param)


def state(job_id: int) -> str:
    return str(Job.objects.get(pk=job_id).state)


def test_a_finish_with_claim_next_answers_the_next_job_with_its_lease(api: Api) -> None:
    first, second = api.enqueue(), api.enqueue()
    job = api.claim(queues=["remote"])
    assert job["id"] == first

    answer = api.finish(job, result="X", claim_next={"queues": ["remote"]})

    assert answer.status == 200, answer
    assert answer.data["state"] == "done"
    nxt = answer.data["job"]
    # The same fields as a claim's answer: the worker goes on with it as with a claimed job.
    assert set(nxt) == {"id", "task", "queue", "args", "kwargs", "attempt", "max_attempts",
                        "timeout", "parent_id", "lease", "steps", "cursors",
                        "trace_context"}  # fmt: skip
    assert (nxt["steps"], nxt["cursors"]) == ({}, {})
    assert (nxt["id"], nxt["task"], nxt["attempt"]) == (second, "remote.upper", 1)
    assert nxt["lease"].endswith(".1.api:" + job["lease"].split(".api:", 1)[1])  # same worker
    assert (state(first), state(second)) == ("done", "running")
    row = Job.objects.get(pk=second)
    assert row.worker_id == Job.objects.get(pk=first).worker_id
    assert Worker.objects.filter(pk=row.worker_id).exists()  # the reaper knows its worker
    # The lease works as a claim's does.
    beat = api.post(f"jobs/{second}/heartbeat", {"lease": nxt["lease"]})
    assert beat.status == 200, beat
    assert api.finish(nxt, claim_next={}).data == {"state": "done", "job": None}
    assert state(second) == "done"


def test_without_claim_next_the_finish_answers_as_before(api: Api) -> None:
    api.enqueue()
    api.enqueue()
    job = api.claim()
    answer = api.finish(job)
    assert (answer.status, answer.data) == (200, {"state": "done"})
    assert Job.objects.filter(state="running").count() == 0


def test_the_next_claim_stays_within_the_tokens_queues_and_the_claims_tasks() -> None:
    wide = Api(token(("default", "remote")), "django")
    narrow = Api(token(("remote",)), "django")
    elsewhere = wide.enqueue(options={"queue": "default"})
    wide.enqueue()
    job = narrow.claim(worker="n1")
    other_task = wide.enqueue()  # remote.upper: passed over by a claim for tests' tasks only

    # claim_next without queues claims from the token's queues only: never "default".
    answer = narrow.finish(job, claim_next={"tasks": ["tests.echo"]})
    assert answer.data == {"state": "done", "job": None}, answer
    assert (state(elsewhere), state(other_task)) == ("pending", "pending")

    job = narrow.claim(worker="n1")
    assert job["id"] == other_task
    third = wide.enqueue()
    answer = narrow.finish(job, claim_next={"queues": ["remote"], "tasks": ["remote.upper"]})
    assert answer.data["job"]["id"] == third, answer
    assert state(elsewhere) == "pending"


@pytest.mark.parametrize(
    ("claim_next", "status", "field"),
    [
        ({"queues": ["default"]}, 403, "claim_next.queues"),
        ({"queues": ["*"]}, 403, "claim_next.queues"),
        ({"queues": []}, 200, None),  # an empty list: as v1/claim, every queue of the token
        ({"queues": "remote"}, 400, "claim_next.queues"),
        ({"tasks": [""]}, 400, "claim_next.tasks"),
        ({"wait": 20}, 400, "claim_next"),
        ({"worker": "w2"}, 400, "claim_next"),
        (True, 400, "claim_next"),
        ([], 400, "claim_next"),
    ],
)
def test_a_next_claim_the_token_may_not_make_is_refused_before_the_finish_is_written(
    claim_next: Any, status: int, field: str | None
) -> None:
    api = Api(token(("remote",)), "django")
    api.enqueue()
    waiting = api.enqueue()
    job = api.claim()
    answer = api.finish(job, claim_next=claim_next)
    assert answer.status == status, answer
    if status != 200:
        assert answer.data["field"] == field, answer
        assert isinstance(answer.data["error"], str) and answer.data["error"]
        # Nothing written: the job still runs, its attempt is open, the next one waits.
        assert (state(job["id"]), state(waiting)) == ("running", "pending")
        assert Attempt.objects.get(job_id=job["id"]).outcome == "running"


def test_a_lost_lease_claims_nothing(api: Api) -> None:
    api.enqueue()
    waiting = api.enqueue()
    job = api.claim()
    assert api.finish(job).status == 200
    # A replayed (or late) finish: the lease is lost, and it is the generic 409 with no job.
    answer = api.finish(job, claim_next={})
    assert answer.status == 409, answer
    assert answer.data == {
        "error": "lease lost: the job was reaped, cancelled or claimed again",
        "field": "lease",
    }
    assert state(waiting) == "pending"
    assert Attempt.objects.filter(job_id=waiting).count() == 0


def test_a_lease_of_another_token_finishes_nothing_and_claims_nothing() -> None:
    owner, other = Api(token(("remote",)), "django"), Api(token(("remote",)), "django")
    owner.enqueue()
    waiting = owner.enqueue()
    job = owner.claim()
    answer = other.finish(job, claim_next={})
    assert (answer.status, answer.data["field"]) == (409, "lease")
    assert (state(job["id"]), state(waiting)) == ("running", "pending")


def test_the_next_claim_obeys_a_paused_queue(api: Api) -> None:
    api.enqueue()
    waiting = api.enqueue()
    job = api.claim()
    controls.pause("remote")
    answer = api.finish(job, claim_next={})
    assert answer.data == {"state": "done", "job": None}, answer
    assert state(waiting) == "pending"
    controls.resume("remote")
    assert api.claim()["id"] == waiting


def test_the_next_claim_obeys_a_queue_limit_and_takes_the_slot_the_finish_freed(
    api: Api,
) -> None:
    api.enqueue()
    waiting = api.enqueue()
    job = api.claim()
    controls.set_limit("remote", 1)
    # The queue's one slot is taken: a claim gets nothing.
    assert api.post("claim", {"worker": "w2"}).status == 204
    # The finish frees it, and the claim in the same statement sees that.
    answer = api.finish(job, claim_next={})
    assert answer.data["job"]["id"] == waiting, answer
    assert Job.objects.filter(queue="remote", state="running").count() == 1


def test_a_failed_attempt_retried_at_once_may_be_claimed_again_by_the_same_finish(
    api: Api,
) -> None:
    job_id = api.enqueue()
    job = api.claim()
    answer = api.finish(job, outcome="error", error="boom", retry_after=0, claim_next={})
    assert answer.data["state"] == "pending"
    # As a database worker's finish_and_claim: the retry is a ready job like any other.
    assert answer.data["job"]["id"] == job_id and answer.data["job"]["attempt"] == 2


# ---------------------------------------------------------------------- round trips


def test_finish_then_claim_is_one_round_trip_and_one_transaction_registration_included() -> None:
    api = Api(token(("remote",)), "django")
    first, second = api.enqueue(), api.enqueue()
    job = api.claim()
    grant = auth.cache.lookup(api.token)
    assert grant is not None
    lease = protocol.parse_lease({"lease": job["lease"]}, first, grant.worker_prefix)
    ending = protocol.finish({"outcome": "done"})
    info = operations.worker_info(lease.worker_id, "127.0.0.1", ["remote"], name="w1")
    registrations._at.clear()  # the registration is due: it goes in the same round trip

    with CaptureQueriesContext(connection) as sent:
        ended, claimed = operations.finish_then_claim(lease, ending, info, ["remote"], [])

    assert ended is not None and ended.state == "done"
    assert claimed is not None and claimed.id == second
    # One message, which PostgreSQL runs as one implicit transaction: the settings, the
    # registration, and the finish with its claim.
    assert len(sent.captured_queries) == 1, sent.captured_queries
    text = sent.captured_queries[0]["sql"]
    assert "django_jobs_worker" in text and "django_jobs_finish(" in text
    assert "django_jobs_claim(" in text


def test_a_claim_sends_its_registration_in_its_own_round_trip() -> None:
    api = Api(token(("remote",)), "django")
    job_id = api.enqueue()
    info = operations.worker_info("api:x:w1", "127.0.0.1", ["remote"], name="w1")
    with CaptureQueriesContext(connection) as sent:
        claimed = operations.claim(info, ["remote"], [])
    assert claimed is not None and claimed.id == job_id
    assert len(sent.captured_queries) == 1, sent.captured_queries
    assert Worker.objects.filter(pk="api:x:w1").exists()
    # Not due again within the heartbeat interval: the claim alone.
    api.enqueue()
    with CaptureQueriesContext(connection) as sent:
        operations.claim(info, ["remote"], [])
    assert "django_jobs_worker" not in sent.captured_queries[0]["sql"]


def test_a_registration_that_fails_is_due_again(monkeypatch: pytest.MonkeyPatch) -> None:
    info = operations.worker_info("api:x:w9", "127.0.0.1", ["remote"], name="w9")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("down")

    monkeypatch.setattr(store, "claim", broken)
    with pytest.raises(RuntimeError):
        operations.claim(info, ["remote"], [])
    assert registrations.due(info.id)
