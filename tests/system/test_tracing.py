"""Traces with OpenTelemetry across real worker processes: the enqueue's span (in this process),
the run's span (in the executor, which the test project configures to write its spans to a file,
testproject/testjobs/spans.py), and the runs of the children a job enqueues."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from django_jobs.models import Job
from testproject.testjobs import spans
from testproject.testjobs.jobs import echo, fail, sleep, tree
from testproject.testjobs.tasks import send_digest
from tests.conftest import ROOT, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

Spans = list[dict[str, Any]]


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exported: InMemorySpanExporter) -> Tracer:
    """A tracer of this process, whose spans ``exported`` keeps (a provider of the test's own:
    the global one is left alone)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return provider.get_tracer("tests")


@pytest.fixture
def run_traced(start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> Callable[[], Spans]:
    """Run every ready job with a burst worker whose processes export their spans; the spans of
    the runs."""
    path = tmp_path / "spans.jsonl"

    def run() -> Spans:
        worker = start_worker("--burst", env={spans.VARIABLE: str(path)})
        assert worker.wait() == 0, worker.output
        return [span for span in spans.read(str(path)) if span["name"].startswith("run ")]

    return run


def run_of(found: Spans, job: Job) -> dict[str, Any]:
    (span,) = [s for s in found if s["attributes"]["django_jobs.job.id"] == job.pk]
    return span


def ids_of(span: Any) -> dict[str, str]:
    context = span.get_span_context()
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def test_a_jobs_run_is_a_span_linked_to_the_span_it_was_enqueued_in(
    tracer: Tracer, exported: InMemorySpanExporter, run_traced: Callable[[], Spans]
) -> None:
    with tracer.start_as_current_span("checkout") as request:
        job = echo.enqueue("hello")

    (run,) = run_traced()

    assert run["name"] == "run tests.echo"
    assert run["kind"] == "CONSUMER"
    # A link to the enqueue's span, not a child of it: the run may come hours later.
    assert run["links"] == [ids_of(request)]
    assert run["trace_id"] != ids_of(request)["trace_id"]
    assert run["parent_span_id"] is None
    assert run["attributes"] == {
        "django_jobs.job.id": job.pk,
        "django_jobs.job.task": "tests.echo",
        "django_jobs.job.queue": "default",
        "django_jobs.job.attempt": 1,
        "django_jobs.job.outcome": "done",
        "messaging.system": "django_jobs",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
    }
    assert run["status"] == "UNSET" and run["events"] == []
    assert run["pid"] != os.getpid()
    assert [span.name for span in exported.get_finished_spans()] == ["checkout"]


def test_the_children_a_job_enqueues_link_to_the_run_that_enqueued_them(
    tracer: Tracer, run_traced: Callable[[], Spans]
) -> None:
    with tracer.start_as_current_span("request") as request:
        parent = tree.enqueue(1)

    found = run_traced()

    child, noop = Job.objects.filter(parent_id=parent.pk).order_by("id")
    assert {child.task, noop.task} == {"tests.tree", "tests.noop"}
    parent_run, child_run, noop_run = (run_of(found, job) for job in (parent, child, noop))
    assert parent_run["links"] == [ids_of(request)]
    parent_ids = {"trace_id": parent_run["trace_id"], "span_id": parent_run["span_id"]}
    assert child_run["links"] == noop_run["links"] == [parent_ids]
    stored = Job.objects.get(pk=child.pk).trace_context["traceparent"]
    assert stored.startswith(f"00-{parent_run['trace_id']}-{parent_run['span_id']}-")


def test_a_failed_run_records_its_exception_and_ends_in_error(
    tracer: Tracer, run_traced: Callable[[], Spans]
) -> None:
    with tracer.start_as_current_span("request") as request:
        job = fail.enqueue("the disk is full")

    (run,) = run_traced()

    assert run["links"] == [ids_of(request)]
    assert run["attributes"]["django_jobs.job.outcome"] == "error"
    assert run["status"] == "ERROR"
    assert run["status_description"] == "ValueError: the disk is full"
    (event,) = run["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "the disk is full"
    assert "raise ValueError(message)" in event["attributes"]["exception.stacktrace"]
    assert Job.objects.get(pk=job.pk).state == "error"


def test_a_run_stopped_by_its_worker_ends_its_span_before_the_executor_dies(
    tracer: Tracer, run_traced: Callable[[], Spans]
) -> None:
    # The executor dies of the supervisor's SIGTERM (here at the job's timeout), and does not
    # know why it was stopped: the outcome is "stopped", the job's own record says timeout.
    with tracer.start_as_current_span("request") as request:
        job = sleep.using(timeout=1).enqueue(60)

    (run,) = run_traced()

    assert run["links"] == [ids_of(request)]
    assert run["attributes"]["django_jobs.job.outcome"] == "stopped"
    assert run["status"] == "ERROR"
    assert Job.objects.get(pk=job.pk).state == "error"


def test_a_task_of_djangos_tasks_framework_is_traced_alike(
    tracer: Tracer, run_traced: Callable[[], Spans]
) -> None:
    with tracer.start_as_current_span("request") as request:
        result = send_digest.enqueue(5)

    (run,) = run_traced()

    assert run["links"] == [ids_of(request)]
    assert run["attributes"]["django_jobs.job.id"] == int(result.id)
    assert run["attributes"]["django_jobs.job.outcome"] == "done"


def test_a_job_enqueued_outside_a_span_has_no_trace_context_and_its_run_no_link(
    run_traced: Callable[[], Spans],
) -> None:
    job = echo.enqueue("hello")

    (run,) = run_traced()

    assert Job.objects.get(pk=job.pk).trace_context is None
    assert run["links"] == []
    assert run["attributes"]["django_jobs.job.outcome"] == "done"


def test_without_opentelemetry_jobs_are_enqueued_and_run_as_before(
    start_worker: Callable[..., WorkerProcess], worker_env: dict[str, str], tmp_path: Path
) -> None:
    # Every process of these commands (the worker's executors too) finds no opentelemetry.
    shadow = tmp_path / "shadow"
    (shadow / "opentelemetry").mkdir(parents=True)
    (shadow / "opentelemetry" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'opentelemetry' (hidden by the test)\")\n"
    )
    paths = [str(shadow), str(ROOT), worker_env.get("PYTHONPATH", "")]
    env = {**worker_env, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    probe = "from django_jobs.runtime import tracing; print(tracing.trace is None)"
    checked = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert checked.stdout.strip() == "True", checked.stderr
    enqueue = [sys.executable, "manage.py", "jobs", "enqueue", "tests.tree", "--args", "[1]"]
    enqueued = subprocess.run(enqueue, env=env, cwd=ROOT, capture_output=True, text=True)
    assert enqueued.returncode == 0, enqueued.stdout + enqueued.stderr

    worker = start_worker("--burst", env={"PYTHONPATH": env["PYTHONPATH"]})

    assert worker.wait() == 0, worker.output
    jobs = Job.objects.order_by("id")
    assert [(job.task, job.state, job.trace_context) for job in jobs] == [
        ("tests.tree", "done", None),
        ("tests.tree", "done", None),
        ("tests.noop", "done", None),
    ]
