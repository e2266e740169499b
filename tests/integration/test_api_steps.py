"""Steps and cursors over the HTTP API, for workers in any language: a claim's answer carries the
job's recorded steps and cursors (in the claim's one statement), ``v1/jobs/<id>/steps`` records
a step, ``v1/jobs/<id>/cursor`` and ``progress`` save cursors, fenced on the whole lease and
checked as ``context.step()`` checks them; and ``v1/jobs/<id>`` shows a job of the token's
queues. Served both ways: Django's URL handler and ``with_api``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_jobs import conf, store
from django_jobs.api import operations, protocol
from django_jobs.models import Job, Step
from django_jobs.store.sql import query
from django_jobs.tokens import auth
from tests.integration.helpers import Answer, ServedApi, make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]


class Api(ServedApi):
    """The API of one token, through Django's URL handler or through ``with_api``."""

    def enqueue(self, **options: Any) -> int:
        body = {"task": "remote.upper", "args": ["x"], "options": options}
        answer = self.post("enqueue", body)
        assert answer.status == 201, answer
        return int(answer.data["job"]["id"])

    def claim(self, worker: str = "w1") -> dict[str, Any]:
        answer = self.post("claim", {"worker": worker, "queues": ["remote"]})
        assert answer.status == 200, answer
        return dict(answer.data["job"])

    def on(self, job: dict[str, Any], action: str, **body: Any) -> Answer:
        return self.post(f"jobs/{job['id']}/{action}", {"lease": job["lease"], **body})

    def step(self, job: dict[str, Any], name: Any, result: Any, **body: Any) -> Answer:
        return self.on(job, "steps", name=name, result=result, **body)

    def cursor(self, job: dict[str, Any], name: Any, value: Any) -> Answer:
        return self.on(job, "cursor", name=name, value=value)

    def fail(self, job: dict[str, Any]) -> None:
        """Finish the attempt in error, retried at once."""
        answer = self.on(job, "finish", outcome="error", error="interrupted", retry_after=0)
        assert answer.data == {"state": "pending"}, answer


@pytest.fixture(params=["django", "asgi"])
def api(request: pytest.FixtureRequest) -> Api:
    return Api(make_token(can_enqueue=True), request.param)


def cursors_of(job_id: int) -> dict[str, Any] | None:
    return Job.objects.get(pk=job_id).cursors


# ---------------------------------------------------------------------- resuming


def test_a_retried_job_is_claimed_with_the_steps_and_cursors_its_first_attempt_recorded(
    api: Api,
) -> None:
    job_id = api.enqueue(max_attempts=3)
    first = api.claim()
    assert (first["steps"], first["cursors"]) == ({}, {})

    recorded = api.step(first, "fetch", {"rows": [1, 2]}, duration=1.5)
    assert (recorded.status, recorded.data) == (201, {"result": {"rows": [1, 2]}, "recorded": True})
    assert api.step(first, "nothing", None).status == 201  # null is a result
    saved = api.cursor(first, "page", 3)
    assert (saved.status, saved.data) == (200, {"saved": True})
    # As runjobworker --api sends them: with the run's progress, or alone.
    report = api.on(first, "progress", progress={"done": 3}, cursors={"seen": {"ids": [6]}})
    assert (report.status, report.data) == (200, {"progress": True, "log": False})
    report = api.on(first, "progress", cursors={"seen": {"ids": [7]}})
    assert (report.status, report.data) == (200, {"progress": True, "log": False})
    assert Job.objects.get(pk=job_id).progress_done == 3
    api.fail(first)

    second = api.claim()
    assert (second["id"], second["attempt"]) == (job_id, 2)
    assert second["steps"] == {"fetch": {"rows": [1, 2]}, "nothing": None}
    assert second["cursors"] == {"page": 3, "seen": {"ids": [7]}}
    step = Step.objects.get(job_id=job_id, name="fetch")
    assert (step.attempt, step.result, step.duration, step.result_bytes) == (
        1, {"rows": [1, 2]}, 1.5, len('{"rows":[1,2]}')
    )  # fmt: skip
    # The second attempt moves a cursor on: the newest value, with the attempt that saved it.
    assert api.cursor(second, "page", 4).status == 200
    assert {name: (c["value"], c["attempt"]) for name, c in cursors_of(job_id).items()} == {
        "page": (4, 2),
        "seen": ({"ids": [7]}, 1),
    }


def test_a_step_recorded_already_is_answered_with_its_first_result(api: Api) -> None:
    api.enqueue(max_attempts=3)
    first = api.claim()
    assert api.step(first, "charge", {"id": "ch_1"}).status == 201
    # The same request sent again (its answer was lost): the first record stands.
    again = api.step(first, "charge", {"id": "ch_2"})
    assert (again.status, again.data) == (200, {"result": {"id": "ch_1"}, "recorded": False})
    api.fail(first)
    # A later attempt that runs the step anyway (a worker that ignores the claim's answer).
    later = api.step(api.claim(), "charge", {"id": "ch_3"})
    assert (later.status, later.data) == (200, {"result": {"id": "ch_1"}, "recorded": False})
    assert list(Step.objects.values_list("name", "attempt", "result")) == [
        ("charge", 1, {"id": "ch_1"})
    ]


def test_a_finish_with_claim_next_answers_the_next_job_with_its_steps_and_cursors(
    api: Api,
) -> None:
    job_id = api.enqueue(max_attempts=3)
    first = api.claim()
    assert api.step(first, "a", [1]).status == 201
    assert api.cursor(first, "next", 10).status == 200
    # Retried at once, the job is claimed again by its own finish, which carries what it kept.
    answer = api.on(first, "finish", outcome="error", retry_after=0, claim_next={})
    assert answer.data["state"] == "pending", answer
    nxt = answer.data["job"]
    assert (nxt["id"], nxt["attempt"]) == (job_id, 2)
    assert (nxt["steps"], nxt["cursors"]) == ({"a": [1]}, {"next": 10})
    # Another job comes next with none.
    other = api.enqueue()
    answer = api.on(nxt, "finish", outcome="done", claim_next={})
    assert answer.data["job"]["id"] == other, answer
    assert (answer.data["job"]["steps"], answer.data["job"]["cursors"]) == ({}, {})


def test_children_spawned_in_a_step_are_made_the_jobs_own(api: Api) -> None:
    api.enqueue()
    parent = api.claim()
    spawned = api.on(parent, "spawn", task="remote.upper", args=["c"])
    assert spawned.status == 201, spawned
    child = spawned.data["job"]["id"]
    assert Job.objects.get(pk=child).parent_attempt == 1
    assert api.step(parent, "fan out", [child], children=[child]).status == 201
    assert Job.objects.get(pk=child).parent_attempt is None


# ---------------------------------------------------------------------- fencing


def test_a_lease_that_moved_records_no_step_and_saves_no_cursor(api: Api) -> None:
    job_id = api.enqueue(max_attempts=3)
    old = api.claim()
    assert api.on(old, "release").status == 200
    new = api.claim(worker="w2")  # the same attempt number, another claim
    assert new["attempt"] == old["attempt"]
    lost = {"error": "lease lost: the job was reaped, cancelled or claimed again", "field": "lease"}
    for answer in (
        api.step(old, "a", 1),
        api.cursor(old, "page", 1),
        api.on(old, "progress", cursors={"page": 1}),
    ):
        assert (answer.status, answer.data) == (409, lost)
    assert not Step.objects.filter(job_id=job_id).exists()
    assert cursors_of(job_id) is None
    # Nor after the attempt ended, by the lease that ran it.
    assert api.on(new, "finish", outcome="done").status == 200
    assert api.step(new, "late", 1).status == 409
    assert api.cursor(new, "late", 1).status == 409
    assert not Step.objects.filter(job_id=job_id).exists()
    assert cursors_of(job_id) is None


def test_a_lease_of_another_token_records_nothing() -> None:
    owner, other = Api(make_token(can_enqueue=True)), Api(make_token())
    job_id = owner.enqueue()
    job = owner.claim()
    assert other.step(job, "a", 1).status == 409
    assert other.cursor(job, "page", 1).status == 409
    assert not Step.objects.filter(job_id=job_id).exists() and cursors_of(job_id) is None


# ---------------------------------------------------------------------- refusals


def nothing_recorded(job_id: int) -> bool:
    return not Step.objects.filter(job_id=job_id).exists() and cursors_of(job_id) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"result": 1}, "name"),
        ({"name": "", "result": 1}, "name"),
        ({"name": 5, "result": 1}, "name"),
        ({"name": ["a"], "result": 1}, "name"),
        ({"name": "x" * 201, "result": 1}, "name"),
        ({"name": "nul\x00", "result": 1}, "name"),
        ({"name": "a"}, "result"),
        ({"name": "a", "result": "nul\x00"}, "result"),
        ({"name": "a", "result": {"k": "\ud800"}}, "result"),
        ({"name": "a", "result": 1, "duration": -1}, "duration"),
        ({"name": "a", "result": 1, "duration": "soon"}, "duration"),
        ({"name": "a", "result": 1, "duration": True}, "duration"),
        ({"name": "a", "result": 1, "duration": 1e300}, "duration"),
        ({"name": "a", "result": 1, "children": "x"}, "children"),
        ({"name": "a", "result": 1, "children": [0]}, "children"),
        ({"name": "a", "result": 1, "children": [True]}, "children"),
        ({"name": "a", "result": 1, "children": [2**63]}, "children"),
    ],
)
def test_a_bad_step_gets_400_naming_the_field_and_records_nothing(
    api: Api, body: dict[str, Any], field: str
) -> None:
    api.enqueue()
    job = api.claim()
    answer = api.on(job, "steps", **body)
    assert (answer.status, answer.data["field"]) == (400, field), answer
    assert isinstance(answer.data["error"], str) and answer.data["error"]
    assert nothing_recorded(job["id"])


@pytest.mark.parametrize(
    ("action", "body", "field"),
    [
        ("cursor", {"value": 1}, "name"),
        ("cursor", {"name": "", "value": 1}, "name"),
        ("cursor", {"name": 3, "value": 1}, "name"),
        ("cursor", {"name": "x" * 201, "value": 1}, "name"),
        ("cursor", {"name": "page"}, "value"),
        ("cursor", {"name": "page", "value": "nul\x00"}, "value"),
        ("progress", {"cursors": [1]}, "cursors"),
        ("progress", {"cursors": "page"}, "cursors"),
        ("progress", {"cursors": {"": 1}}, "cursors"),
        ("progress", {"cursors": {"x" * 201: 1}}, "cursors"),
        ("progress", {"cursors": {"page": "nul\x00"}}, "cursors.page"),
        ("progress", {"progress": {"done": 1}, "cursors": {"ok": 1, "": 2}}, "cursors"),
    ],
)
def test_a_bad_cursor_gets_400_naming_the_field_and_saves_nothing(
    api: Api, action: str, body: dict[str, Any], field: str
) -> None:
    api.enqueue()
    job = api.claim()
    answer = api.on(job, action, **body)
    assert (answer.status, answer.data["field"]) == (400, field), answer
    assert nothing_recorded(job["id"])
    assert Job.objects.get(pk=job["id"]).progress_done is None


@override_settings(JOBS_MAX_PAYLOAD_BYTES=1000)
def test_a_result_or_value_over_the_payload_limit_is_400_and_one_at_it_fits(api: Api) -> None:
    api.enqueue()
    job = api.claim()
    at_limit = "x" * (1000 - 2)  # its JSON: 1,000 bytes, quotes included
    for answer, field in [
        (api.step(job, "big", at_limit + "x"), "result"),
        (api.cursor(job, "big", at_limit + "x"), "value"),
        (api.on(job, "progress", cursors={"big": at_limit + "x"}), "cursors"),
    ]:
        assert (answer.status, answer.data["field"]) == (400, field), answer
        assert "JOBS_MAX_PAYLOAD_BYTES" in answer.data["error"]
    assert nothing_recorded(job["id"])
    assert api.step(job, "big", at_limit).status == 201
    assert api.cursor(job, "big", at_limit).status == 200


def test_a_step_result_of_the_default_payload_limit_fits_in_a_body_and_more_is_413(
    api: Api,
) -> None:
    api.enqueue()
    job = api.claim()
    limit = conf.max_payload_bytes()
    # Sent escaped (6 bytes a character) and indented: still within the body's limit.
    result = {"text": "é" * ((limit - 20) // 6)}
    data = json.dumps({"lease": job["lease"], "name": "big", "result": result}, indent=4)
    assert len(json.dumps(result)) <= limit < len(data) < protocol.max_body_bytes()
    answer = api.raw(f"jobs/{job['id']}/steps", data.encode())
    assert (answer.status, answer.data["recorded"]) == (201, True), answer
    assert answer.data["result"] == result
    over = {"lease": job["lease"], "name": "bigger", "result": "x" * protocol.max_body_bytes()}
    answer = api.post(f"jobs/{job['id']}/steps", over)
    assert (answer.status, answer.data["field"]) == (413, None), answer
    assert list(Step.objects.values_list("name", flat=True)) == ["big"]


@pytest.mark.parametrize("action", ["steps", "cursor", "progress", ""])
def test_a_request_without_a_valid_token_gets_401_before_its_body_is_read(action: str) -> None:
    owner = Api(make_token(can_enqueue=True))
    owner.enqueue()
    job = owner.claim()
    path = f"jobs/{job['id']}/{action}".rstrip("/")
    for anonymous in (Api(None), Api("djt_not-a-token")):
        answer = anonymous.raw(path, b'{"lease": "not json')
        assert (answer.status, answer.data["field"]) == (401, None), answer
    assert nothing_recorded(job["id"])


# ---------------------------------------------------------------------- the job view


def test_the_job_view_shows_a_job_its_steps_and_its_cursors(api: Api) -> None:
    job_id = api.enqueue(max_attempts=3)
    first = api.claim()
    assert api.step(first, "fetch", {"rows": [1, 2]}, duration=0.25).status == 201
    assert api.on(first, "progress", progress={"done": 2, "total": 5, "message": "two"},
                  cursors={"page": 2}).status == 200  # fmt: skip
    api.fail(first)
    second = api.claim()
    assert api.step(second, "load", "ok").status == 201

    answer = api.post(f"jobs/{job_id}", {})

    assert answer.status == 200, answer
    view = answer.data["job"]
    row = Job.objects.get(pk=job_id)
    assert {k: view[k] for k in ("id", "task", "queue", "state", "attempt", "max_attempts")} == {
        "id": job_id, "task": "remote.upper", "queue": "remote", "state": "running",
        "attempt": 2, "max_attempts": 3,
    }  # fmt: skip
    assert (view["error"], view["cancel_requested"], view["finished_at"]) == (
        "interrupted", False, None
    )  # fmt: skip
    assert view["created_at"] == row.created_at.isoformat()
    assert view["started_at"] == row.started_at.isoformat()
    assert view["progress"] == {"done": 2, "total": 5, "message": "two"}
    steps = Step.objects.filter(job_id=job_id).order_by("id")
    assert view["steps"] == [
        {"name": s.name, "attempt": s.attempt, "recorded_at": s.recorded_at.isoformat(),
         "duration": s.duration, "result_bytes": s.result_bytes}
        for s in steps
    ]  # fmt: skip
    assert [(s["name"], s["attempt"], s["result_bytes"]) for s in view["steps"]] == [
        ("fetch", 1, len('{"rows":[1,2]}')),
        ("load", 2, len('"ok"')),
    ]
    assert view["cursors"] == {
        "page": {"value": 2, "attempt": 1, "saved_at": row.cursors["page"]["saved_at"]}
    }
    assert set(view) == {
        "id", "task", "queue", "state", "attempt", "max_attempts", "created_at", "started_at",
        "finished_at", "error", "cancel_requested", "progress", "steps", "cursors",
    }  # fmt: skip


def test_the_job_view_of_a_job_without_steps_progress_or_cursors(api: Api) -> None:
    job_id = api.enqueue()
    view = api.post(f"jobs/{job_id}", {}).data["job"]
    assert (view["state"], view["attempt"], view["started_at"]) == ("pending", 0, None)
    assert (view["progress"], view["steps"], view["cursors"]) == (None, [], {})


def test_the_job_view_answers_404_alike_for_a_job_of_another_queue_and_no_job() -> None:
    enqueuer = Api(make_token(("default", "remote"), can_enqueue=True))
    elsewhere = enqueuer.enqueue(queue="default")
    here = enqueuer.enqueue()
    remote_only = Api(make_token(("remote",)))  # a claim-only token sees the jobs of its queues
    assert remote_only.post(f"jobs/{here}", {}).status == 200
    hidden = remote_only.post(f"jobs/{elsewhere}", {})
    missing = remote_only.post(f"jobs/{here + 1000}", {})
    assert hidden.status == missing.status == 404
    assert hidden.data == missing.data and hidden.data["field"] == "job_id"
    every = Api(make_token(("*",)))
    assert every.post(f"jobs/{elsewhere}", {}).status == 200
    too_big = every.post(f"jobs/{2**63}", {})
    assert (too_big.status, too_big.data["field"]) == (400, "job_id")


# ---------------------------------------------------------------------- the claim's cost


def test_a_claim_reads_the_steps_and_cursors_in_its_one_statement() -> None:
    api = Api(make_token(can_enqueue=True))
    job_id = api.enqueue(max_attempts=3)
    first = api.claim()
    assert api.step(first, "a", 1).status == 201
    assert api.cursor(first, "page", 2).status == 200
    api.fail(first)
    info = operations.worker_info("api:x:w1", "127.0.0.1", ["remote"], name="w1")
    operations.registrations.due(info.id)  # registered: the claim alone is sent

    with CaptureQueriesContext(connection) as sent:
        claimed = operations.claim(info, ["remote"], [])

    assert len(sent.captured_queries) == 1, sent.captured_queries
    assert "django_jobs_checkpoint(c.id)" in sent.captured_queries[0]["sql"]
    assert claimed is not None and claimed.id == job_id and claimed.checkpoint is not None
    assert claimed.checkpoint.decoded() == {"steps": {"a": 1}, "cursors": {"page": 2}}
    # The database worker's claim is the plain one: its run reads a checkpoint only if it asks.
    assert "django_jobs_checkpoint" not in query("call_claim")


def test_a_finish_with_claim_next_reads_the_next_jobs_checkpoint_in_its_one_statement() -> None:
    api = Api(make_token(("remote",), can_enqueue=True))
    retried = api.enqueue(max_attempts=3)
    first = api.claim()
    assert api.cursor(first, "page", 5).status == 200
    api.fail(first)
    running = api.enqueue()
    job = api.claim()
    assert job["id"] == retried and job["cursors"] == {"page": 5}
    grant = auth.cache.lookup(api.token)
    assert grant is not None
    lease = protocol.parse_lease({"lease": job["lease"]}, retried, grant.worker_prefix)
    info = operations.worker_info(lease.worker_id, "127.0.0.1", ["remote"], name="w1")
    operations.registrations.due(info.id)

    with CaptureQueriesContext(connection) as sent:
        ended, claimed = operations.finish_then_claim(
            lease, protocol.finish({"outcome": "done"}), info, ["remote"], []
        )

    assert len(sent.captured_queries) == 1, sent.captured_queries
    assert ended is not None and claimed is not None and claimed.id == running
    assert claimed.checkpoint == store.Checkpoint()
