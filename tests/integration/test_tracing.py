"""The trace context a job is enqueued in: stored with the job by every way of enqueueing it,
inside an active OpenTelemetry span, NULL outside one, and handed back by the claim (a
database worker's and the HTTP API's). The runs' spans are tests/system/test_tracing.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
    Tracer,
    TraceState,
    set_span_in_context,
)

from django_jobs import store
from django_jobs.models import Job
from django_jobs.worker import http_queue
from testproject.testjobs import tasks
from testproject.testjobs.jobs import echo
from tests.integration.helpers import Api, make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]


@pytest.fixture
def tracer() -> Tracer:
    return TracerProvider().get_tracer("tests")


@pytest.fixture
def span(tracer: Tracer) -> Iterator[Span]:
    """A span of this test, current while it runs."""
    with tracer.start_as_current_span("request") as current:
        yield current


def traceparent(span: Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def stored(job: Any) -> dict[str, str] | None:
    return Job.objects.get(pk=job.pk).trace_context


def test_an_enqueue_in_a_span_stores_its_trace_context(span: Span) -> None:
    job = echo.enqueue(1)

    assert job.trace_context == stored(job) == {"traceparent": traceparent(span)}


def test_the_trace_state_goes_with_the_trace_context(tracer: Tracer) -> None:
    # A span continued from a caller that sent a tracestate, as a server's would be.
    caller = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True,
                         TraceFlags(1), TraceState([("vendor", "value")]))  # fmt: skip
    remote = set_span_in_context(NonRecordingSpan(caller))
    with tracer.start_as_current_span("request", context=remote) as span:
        job = echo.enqueue(1)

    assert stored(job) == {"traceparent": traceparent(span), "tracestate": "vendor=value"}


def test_every_way_of_enqueueing_stores_the_trace_context(span: Span) -> None:
    expected = {"traceparent": traceparent(span)}
    first = echo.using(queue="reports", priority=5).enqueue()
    many = echo.enqueue_many([((1,), {}), ((2,), {})])
    dependent = echo.using(depends_on=[first]).enqueue()
    child = echo.using(parent=first.pk).enqueue()
    task_result = tasks.send_digest.enqueue(5)

    jobs = [first, *many, dependent, child, Job.objects.get(pk=int(task_result.id))]
    assert [stored(job) for job in jobs] == [expected] * 6
    assert [job.trace_context for job in many] == [expected] * 2


def test_outside_a_span_nothing_is_stored() -> None:
    first = echo.enqueue(1)
    jobs = [first, *echo.enqueue_many([((1,), {})]), echo.using(parent=first.pk).enqueue()]

    assert [stored(job) for job in jobs] == [None] * 3


def test_the_claim_hands_the_trace_context_to_the_worker(tracer: Tracer) -> None:
    with tracer.start_as_current_span("request") as span:
        traced = echo.enqueue(1)
    untraced = echo.enqueue(2)

    with connection.cursor() as cursor:
        first = store.claim(cursor, "w:1:a", None)
        second = store.claim(cursor, "w:1:a", None)

    assert first is not None and second is not None
    assert (first.id, first.trace_context) == (traced.pk, {"traceparent": traceparent(span)})
    assert (second.id, second.trace_context) == (untraced.pk, None)


def test_the_http_apis_claim_answers_the_trace_context_its_worker_reads(span: Span) -> None:
    job = echo.enqueue(1)
    api = Api(make_token(("default",)))

    answer = api.claim(queues=["default"])

    assert answer.status_code == 200, answer.data
    assert answer.data["job"]["trace_context"] == {"traceparent": traceparent(span)}
    claimed = http_queue.claimed_job("api:w", answer.data["job"])
    assert (claimed.id, claimed.trace_context) == (job.pk, {"traceparent": traceparent(span)})


def test_an_older_servers_claim_answer_without_a_trace_context_is_read_as_none() -> None:
    answer = {
        "id": 1, "task": "tests.echo", "queue": "default", "args": [], "kwargs": {},
        "attempt": 1, "max_attempts": 1, "timeout": None, "parent_id": None, "lease": "1.x",
    }  # fmt: skip

    assert http_queue.claimed_job("api:w", answer).trace_context is None


def test_the_http_apis_enqueue_stores_the_requests_w3c_headers() -> None:
    api = Api(make_token(("remote",), can_enqueue=True))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = {"HTTP_TRACEPARENT": parent, "HTTP_TRACESTATE": "vendor=value"}

    created = api.client.post(
        "/jobs/api/v1/enqueue",
        {"task": "remote.upper", "args": ["hi"]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.token}",
        **headers,
    )
    plain = api.post("enqueue", {"task": "remote.upper", "args": ["hi"]})

    assert created.status_code == plain.status_code == 201
    job_id = created.json()["job"]["id"]
    assert Job.objects.get(pk=job_id).trace_context == {
        "traceparent": parent,
        "tracestate": "vendor=value",
    }
    assert Job.objects.get(pk=plain.data["job"]["id"]).trace_context is None


def test_a_request_whose_traceparent_is_malformed_stores_none() -> None:
    api = Api(make_token(("remote",), can_enqueue=True))

    created = api.client.post(
        "/jobs/api/v1/enqueue",
        {"task": "remote.upper", "args": ["hi"]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.token}",
        HTTP_TRACEPARENT="not a trace context",
    )

    assert created.status_code == 201
    assert Job.objects.get(pk=created.json()["job"]["id"]).trace_context is None
