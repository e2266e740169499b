"""The HTTP API against hostile and broken clients, in process, served both ways: through
Django's URL handler (the test client) and through the ASGI app of ``with_api``
(``testproject.asgi``, over httpx's ASGI transport). Every bad input gets a JSON 4xx naming its
field and writes nothing; no request gets a 5xx. The raw HTTP cases (a cut-off body, repeated
headers, raw paths) are in tests/system/test_api_raw_http.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db import connection

from django_jobs.api import protocol, views
from django_jobs.models import Attempt, Job, Step, Worker
from django_jobs.tokens import auth
from tests.integration.helpers import Answer, ServedApi, dumps

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]

#: The statuses a request of a hostile client may get.
REFUSALS = {400, 401, 403, 404, 409, 413}


def served(token: str, served_by: str = "django") -> ServedApi:
    """The API of ``token``, served ``served_by``, its paths under the mount point; a view's
    exception is a 500 answer."""
    return ServedApi(token, served_by, base="/jobs/api/", raise_request_exception=False)


@pytest.fixture(params=["django", "asgi"])
def api(request: pytest.FixtureRequest) -> ServedApi:
    token = auth.create("ta", ["default", "remote"], can_enqueue=True)[1]
    return served(token, request.param)


def snapshot() -> list[Any]:
    """Every row of the jobs, attempts and workers tables."""
    rows = []
    with connection.cursor() as cursor:
        for table in ("django_jobs_job", "django_jobs_attempt", "django_jobs_worker"):
            cursor.execute(f"SELECT to_jsonb(t)::text FROM {table} t ORDER BY 1")
            rows.append([row[0] for row in cursor.fetchall()])
    return rows


def claimed_job(api: ServedApi) -> dict[str, Any]:
    """A running job of ``api``'s token, and another one pending."""
    for _ in range(2):
        assert api.post("v1/enqueue", {"task": "remote.upper", "args": ["x"]}).status == 201
    answer = api.post("v1/claim", {"worker": "w1", "queues": ["remote"]})
    assert answer.status == 200, answer
    return dict(answer.data["job"])


def refused(answer: Answer, status: int | set[int], field: Any = ...) -> None:
    statuses = {status} if isinstance(status, int) else status
    assert answer.status in statuses, answer
    assert answer.headers.get("Content-Type", answer.headers.get("content-type")) == (
        "application/json"
    ), answer
    assert isinstance(answer.data, dict) and isinstance(answer.data["error"], str), answer
    if isinstance(field, frozenset):
        assert answer.data["field"] in field, answer
    elif field is not ...:
        assert answer.data["field"] == field, answer


# ---------------------------------------------------------------------- item 1: not outages


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("v1/claim", {"worker": "w1", "queues": ["remote\x00"]}, "queues"),
        ("v1/claim", {"worker": "w1", "tasks": ["remote.upper\x00"]}, "tasks"),
        ("v1/claim", {"worker": "w1", "queues": ["\ud800"]}, "queues"),
        ("v1/claim", {"worker": "w1", "tasks": ["\udfff"]}, "tasks"),
        ("v1/heartbeat", {"worker": "w1", "info": {"host": "h\x00st"}}, "info.host"),
        ("v1/heartbeat", {"worker": "w1", "info": {"pid": 10**30}}, "info.pid"),
        ("v1/heartbeat", {"worker": "w1", "info": {"concurrency": 2**31}}, "info.concurrency"),
        ("v1/heartbeat", {"worker": "w1", "unwritten": [10**25]}, "unwritten"),
        ("v1/enqueue", {"task": "remote.upper", "options": {"depends_on": [10**25]}},
         "options.depends_on"),
    ],
)  # fmt: skip
def test_nul_lone_surrogates_and_huge_integers_are_400_not_503(
    api: ServedApi, path: str, body: dict[str, Any], field: str
) -> None:
    before = snapshot()
    refused(api.post(path, body), 400, field)
    assert snapshot() == before


def test_a_lease_or_job_id_out_of_range_is_400_and_a_log_or_reason_with_nul_too(
    api: ServedApi,
) -> None:
    job = claimed_job(api)
    job_id, lease = job["id"], job["lease"]
    before = snapshot()
    huge_attempt = lease.replace(".1.api:", f".{10**12}.api:")
    assert huge_attempt != lease
    for path, body, field in [
        (f"v1/jobs/{job_id}/heartbeat", {"lease": huge_attempt}, "lease"),
        (f"v1/jobs/{job_id}/finish", {"lease": huge_attempt, "outcome": "done"}, "lease"),
        (f"v1/jobs/{10**25}/heartbeat", {"lease": lease}, "job_id"),
        (f"v1/jobs/{job_id}/progress", {"lease": lease, "log": "a\x00b"}, "log"),
        (f"v1/jobs/{job_id}/progress", {"lease": lease, "log": "a\udc80b"}, "log"),
        (f"v1/jobs/{job_id}/release", {"lease": lease, "reason": "bye\x00"}, "reason"),
        (f"v1/jobs/{job_id}/release", {"lease": lease, "reason": "\ud83d"}, "reason"),
    ]:
        refused(api.post(path, body), 400, field)
    assert snapshot() == before


# ---------------------------------------------------------------------- item 2: no plain 500s


def test_huge_integers_deep_nesting_and_wrong_types_are_400_naming_the_field(
    api: ServedApi,
) -> None:
    job = claimed_job(api)
    job_id, lease = job["id"], job["lease"]
    before = snapshot()
    huge = b"9" * 450  # over float's range, under Python's 4300-digit limit
    held = lease.encode()
    deep = "[" * 1000 + "]" * 1000
    cases: list[tuple[str, bytes, Any]] = [
        ("v1/claim", b'{"worker": "w1", "wait": %s}' % huge, "wait"),
        (f"v1/jobs/{job_id}/finish",
         b'{"lease": "%s", "outcome": "error", "retry_after": %s}' % (held, huge),
         "retry_after"),
        ("v1/enqueue", b'{"task": "remote.upper", "options": {"delay": %s}}' % huge,
         "options.delay"),
        ("v1/enqueue",
         b'{"task": "remote.upper", "options": {"run_after": "0001-01-01T00:00:00+14:00"}}',
         "options.run_after"),
        ("v1/enqueue",
         b'{"task": "remote.upper", "options": {"run_after": "9999-12-31T23:59:59-14:00"}}',
         "options.run_after"),
        (f"v1/jobs/{job_id}/progress",
         b'{"lease": "%s", "progress": {"done": %s}}' % (held, huge),
         "progress.done"),
        (f"v1/jobs/{job_id}/progress",
         b'{"lease": "%s", "progress": {"done": 1, "total": -%s}}' % (held, huge),
         "progress.total"),
        ("v1/claim", b'{"worker": "w1", "wait": %s}' % (b"9" * 5000), None),
        ("v1/claim", b'{"worker": "w1", "wait": NaN}', None),
        ("v1/enqueue", b'{"task": "remote.upper", "args": [-Infinity]}', None),
        # 1,000 levels: JSON's own parser gives up on Python 3.11 (no field), and from 3.12 it
        # parses them and the depth check names the field.
        ("v1/enqueue", b'{"task": "remote.upper", "args": %s}' % deep.encode(),
         frozenset({None, "args"})),
        ("v1/enqueue",
         b'{"task": "remote.upper", "args": %s}' % ("[" * 100 + "]" * 100).encode(), "args"),
        (f"v1/jobs/{job_id}/finish",
         b'{"lease": "%s", "outcome": "done", "result": %s}' % (held, deep.encode()),
         frozenset({None, "result"})),
    ]  # fmt: skip
    for info, field in [
        ({"pid": "abc"}, "info.pid"),
        ({"tasks": 5}, "info.tasks"),
        ({"concurrency": [1]}, "info.concurrency"),
        ({"pod": "pod-\udc00"}, "info.pod"),
        ({"queues": [7]}, "info.queues"),
    ]:
        cases.append(("v1/heartbeat", dumps({"worker": "w1", "info": info}), field))
    digits = lease.replace(".1.api:", ".\u00b2.api:")  # a Unicode digit: "²"
    job_part = lease.replace(f"{job_id}.", "\u0661.", 1)  # ARABIC-INDIC DIGIT ONE
    surrogate_worker = lease.replace(":w1", ":w\udc00")
    for text in (digits, job_part, surrogate_worker):
        assert text != lease
        cases.append((f"v1/jobs/{job_id}/heartbeat", dumps({"lease": text}), "lease"))
        cases.append(("v1/heartbeat", dumps({"worker": "w1", "leases": [text]}), "leases"))
    for path, raw, field in cases:
        refused(api.post(path, raw), 400, field)
    assert snapshot() == before


# ---------------------------------------------------------------------- item 11: nothing written


def test_a_forged_leases_worker_part_registers_nothing(api: ServedApi) -> None:
    job = claimed_job(api)
    job_id, lease = job["id"], job["lease"]
    before = snapshot()
    for worker in ("<img src=x> evil", "w1\n", "", "x" * 91):
        forged = lease.replace(":w1", f":{worker}")
        for path, body in [
            (f"v1/jobs/{job_id}/heartbeat", {"lease": forged}),
            (f"v1/jobs/{job_id}/progress", {"lease": forged, "log": "x"}),
            ("v1/heartbeat", {"worker": "w1", "leases": [forged]}),
        ]:
            refused(api.post(path, body), 400, "lease" if "jobs/" in path else "leases")
    assert snapshot() == before
    assert not Worker.objects.filter(id__contains="evil").exists()


@pytest.mark.parametrize(
    ("info", "field"),
    [
        ({"name": "<script>alert(1)</script>"}, "info.name"),
        ({"name": "x" * 201}, "info.name"),
        ({"name": ""}, "info.name"),
        ({"host": "db.internal evil"}, "info.host"),
        ({"host": "h" * 256}, "info.host"),
        ({"host": "host\n"}, "info.host"),
        ({"pod": "pod/../../x"}, "info.pod"),
        ({"pod": "p" * 254}, "info.pod"),
        ({"pid": -1}, "info.pid"),
        ({"pid": True}, "info.pid"),
        ({"concurrency": 0}, "info.concurrency"),
    ],
)
def test_a_heartbeats_info_is_checked(api: ServedApi, info: dict[str, Any], field: str) -> None:
    refused(api.post("v1/heartbeat", {"worker": "w1", "info": info}), 400, field)
    assert not Worker.objects.exists()


def test_a_valid_info_is_registered_as_sent(api: ServedApi) -> None:
    info = {"name": "gpu-pod-7", "host": "fe80::1%eth0", "pid": 2**31 - 1, "concurrency": 4,
            "pod": "gpu-pod-7.x", "queues": ["remote"], "tasks": ["remote.upper"]}  # fmt: skip
    answer = api.post("v1/heartbeat", {"worker": "gpu-pod-7:12:ab", "info": info})
    assert answer.status == 200, answer
    row = Worker.objects.get()
    assert (row.id, row.name, row.host, row.pid, row.concurrency, row.pod) == (
        "api:ta:gpu-pod-7:12:ab", "gpu-pod-7", "fe80::1%eth0", 2**31 - 1, 4, "gpu-pod-7.x"
    )  # fmt: skip
    assert (row.queues, row.tasks) == (["remote"], ["remote.upper"])


def test_the_longest_names_make_a_lease_the_batch_heartbeat_takes() -> None:
    token = auth.create("n" * 100, ["remote"], can_enqueue=True)[1]
    api = served(token)
    assert api.post("v1/enqueue", {"task": "remote.upper"}).status == 201
    worker = "w" * 90
    answer = api.post("v1/claim", {"worker": worker})
    assert answer.status == 200, answer
    lease = answer.data["job"]["lease"]
    assert len(lease) > 200
    beat = api.post("v1/heartbeat", {"worker": worker, "leases": [lease]})
    assert beat.status == 200, beat
    assert beat.data["leases"][lease]["held"] is True


# ---------------------------------------------------------------------- item 12: JSON errors


def test_a_bug_in_a_view_is_a_json_500_both_ways(
    api: ServedApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(protocol, "worker", broken)
    with caplog.at_level(logging.ERROR, logger="django_jobs.api"):
        answer = api.post("v1/claim", {"worker": "w1"})
    assert answer.status == 500 and answer.data["field"] is None, answer
    assert "bug" in answer.data["error"]
    assert "a bug" in caplog.text  # the traceback is logged on the server, not sent


def test_a_statement_the_database_refuses_for_its_data_is_400_not_503(
    api: ServedApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DataError

    def out_of_range(*args: Any, **kwargs: Any) -> Any:
        raise DataError("integer out of range")

    monkeypatch.setattr(views.operations, "heartbeat", out_of_range)
    refused(api.post("v1/heartbeat", {"worker": "w1"}), 400, None)


def test_unknown_paths_under_the_mount_point_get_a_json_404(api: ServedApi) -> None:
    for path in ("v1/nothing", "v1/claim/", "v1/jobs/abc/finish", "v2/claim", ""):
        refused(api.post(path, {}), 404, None)


def test_django_asgi_handler_does_not_serve_a_percent_encoded_path() -> None:
    # Without with_api: Django's own ASGI handler, which routes on the decoded path.
    from testproject.asgi import django_application

    token = auth.create("ta", ["remote"])[1]

    async def send(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=django_application)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            headers = {"Authorization": f"Bearer {token}"}
            return await client.post(path, content=b'{"worker": "w1"}', headers=headers)

    for path in ("/jobs/api/v1%2Fclaim", "/jobs/api/v1/cl%61im"):
        answer = asyncio.run(send(path))
        assert (answer.status_code, answer.json()["field"]) == (404, None), answer.content
    assert asyncio.run(send("/jobs/api/v1/claim")).status_code == 204
    assert Worker.objects.count() == 1


def test_two_authorization_headers_are_refused_not_last_wins(api: ServedApi) -> None:
    # As servers pass repeated headers on: joined with a comma.
    answer = api.raw("v1/claim", dumps({"worker": "w1"}),
                     {"Authorization": f"Bearer nope,Bearer {api.token}"})  # fmt: skip
    refused(answer, 400, "Authorization")


def test_a_database_that_cannot_be_reached_is_a_503_with_retry_after(
    api: ServedApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("connection refused")

    monkeypatch.setattr(views.operations, "heartbeat", down)
    answer = api.post("v1/heartbeat", {"worker": "w1"})
    refused(answer, 503, None)
    retry_after = answer.headers.get("Retry-After") or answer.headers.get("retry-after")
    assert retry_after is not None and int(retry_after) > 0


# ---------------------------------------------------------------------- every endpoint, fuzzed

HUGE = 10**30


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


HOSTILE: list[tuple[str, Any]] = [
    ("NUL", "a\x00b"),
    ("surrogate", "a\ud800b"),
    ("huge", HUGE),
    ("huger", 10**450),
    ("negative", -(10**20)),
    ("deep", nested(70)),
    ("object", {"a": "\x00"}),
    ("list of NUL", ["\x00"]),
]


def hostile_bodies(job_id: int, lease: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(path, what, body): each field of a valid body of each endpoint, given each hostile
    value. ``result``, ``error`` and ``traceback`` of a finish are left out: their text is
    made storable (the attempt has run), and any JSON is a result. A step's ``result`` and a
    cursor's ``value`` get only the hostile values that are no JSON they could store (any
    number is one)."""
    job = f"v1/jobs/{job_id}"
    bases: list[tuple[str, dict[str, Any]]] = [
        ("v1/claim", {"worker": "w2", "queues": ["remote"], "tasks": ["remote.upper"], "wait": 0}),
        ("v1/heartbeat", {"worker": "w1", "leases": [lease], "unwritten": [job_id],
                          "info": {"name": "w1", "host": "h", "pid": 1, "concurrency": 1,
                                   "pod": "p", "queues": ["remote"], "tasks": ["t"]}}),
        ("v1/enqueue", {"task": "remote.upper", "args": ["x"], "kwargs": {"k": 1},
                        "unique_key": "u", "options": {"queue": "remote", "priority": 1,
                        "max_attempts": 2, "timeout": 5, "concurrency_key": "c",
                        "concurrency_limit": 1, "delay": 1, "depends_on": [job_id]}}),
        (f"{job}/heartbeat", {"lease": lease}),
        (f"{job}/finish", {"lease": lease, "outcome": "error", "retry": True, "retry_after": 1}),
        (f"{job}/finish", {"lease": lease, "outcome": "done",
                           "claim_next": {"queues": ["remote"], "tasks": ["remote.upper"]}}),
        (f"{job}/release", {"lease": lease, "reason": "r"}),
        (f"{job}/progress", {"lease": lease, "progress": {"done": 1, "total": 2, "message": "m"},
                             "log": "l"}),
        (f"{job}/outcome", {"lease": lease}),
        (f"{job}/spawn", {"lease": lease, "task": "remote.upper", "args": [], "kwargs": {},
                          "options": {"priority": 1}}),
        (f"{job}/steps", {"lease": lease, "name": "s", "result": [1], "duration": 0.5,
                          "children": [job_id]}),
        (f"{job}/cursor", {"lease": lease, "name": "page", "value": {"next": 2}}),
        (f"{job}/progress", {"lease": lease, "cursors": {"page": 2}}),
        (job, {}),
    ]  # fmt: skip
    numbers = {"huge", "huger", "negative"}
    for path, base in bases:
        for name, value in base.items():
            if name in ("result", "value") and path != f"{job}/finish":
                hostiles = [(what, hostile) for what, hostile in HOSTILE if what not in numbers]
            else:
                hostiles = HOSTILE
            nested_fields = ("info", "options", "progress", "claim_next")
            inner = value if isinstance(value, dict) and name in nested_fields else {}
            for what, hostile in hostiles:
                if name == "args" and what in ("deep", "list of NUL"):
                    continue  # a list: checked for its strings and depth below
                yield path, f"{name}={what}", {**base, name: hostile}
                for key in inner:
                    if name == "progress" and what in ("huge", "negative"):
                        continue  # a number: kept between 0 and the total
                    yield path, f"{name}.{key}={what}", {**base, name: {**inner, key: hostile}}
        yield path, "a NUL key", {**base, "x\x00": 1}
        yield path, "a deep extra", {**base, "extra": nested(66)}


def test_hostile_bodies_at_every_endpoint_get_a_json_4xx_and_change_nothing(
    api: ServedApi,
) -> None:
    job = claimed_job(api)
    job_id, lease = job["id"], job["lease"]
    before = snapshot()
    failures = []
    count = 0
    for path, what, body in hostile_bodies(job_id, lease):
        count += 1
        answer = api.post(path, body)
        ok = (
            answer.status in REFUSALS
            and isinstance(answer.data, dict)
            and isinstance(answer.data.get("error"), str)
            and (answer.status != 400 or answer.data.get("field") is not None)
        )
        if not ok:
            failures.append(f"{path} {what}: {answer!r}")
    assert not failures, "\n".join(failures)
    assert count > 300
    assert snapshot() == before
    assert not Step.objects.exists()
    assert Job.objects.get(pk=job_id).state == "running"
    assert Attempt.objects.get(job_id=job_id).log == ""
