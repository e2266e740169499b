"""Traces of jobs with OpenTelemetry, when ``opentelemetry-api`` is installed (the ``otel`` extra).

An enqueue inside an active span stores that span's W3C trace context with the job
(:func:`current_context`, the job's ``trace_context``). Each run of the job is a span of its own
in the executor that runs it (:func:`run_span`), linked to the stored context rather than its
child: a job may run hours after its enqueue, and its attempts are runs of their own. The run's
span is current while the job's code runs, so that a child the job enqueues links to it.

Spans go to the global tracer provider, which the application configures (exporter, collector)
as for any library; without one they are not recorded. Without ``opentelemetry`` installed, each
function here returns at its first line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]
    _PROPAGATOR = None
else:
    _PROPAGATOR = TraceContextTextMapPropagator()

#: The instrumentation's name: the tracer's, and the ``messaging.system`` of its spans.
NAME = "django_jobs"

#: The W3C headers of an HTTP request that carry a trace context (the HTTP API's enqueue).
HEADERS = ("traceparent", "tracestate")


def current_context() -> dict[str, str] | None:
    """The W3C trace context of the span current here, as the propagator writes it
    (``{"traceparent": ..., "tracestate": ...}``, the latter only when there is one); ``None``
    without OpenTelemetry or an active span."""
    if trace is None or _PROPAGATOR is None:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def request_context(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The trace context of an HTTP request: its own W3C headers, else the span current while
    it is handled (a server's instrumentation). ``None`` without either."""
    if trace is None:
        return None
    carrier = {name: headers[name] for name in HEADERS if headers.get(name)}
    if "traceparent" in carrier and _link(carrier) is not None:
        return carrier
    return current_context()


@contextlib.contextmanager
def within(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context ``carrier`` current for the block (a request handled in a thread
    of its own); with ``None`` or without OpenTelemetry, leave the current context as it is."""
    if trace is None or _PROPAGATOR is None or not carrier:
        yield
        return
    token = otel_context.attach(_PROPAGATOR.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def headers() -> dict[str, str]:
    """The W3C headers of the span current here, for a request to the HTTP API (a child
    spawned over it links to the run that spawned it); empty without one."""
    return current_context() or {}


def _link(carrier: Mapping[str, str] | None) -> Any:
    """A link to the span ``carrier`` names; ``None`` if it names none."""
    if not carrier or trace is None or _PROPAGATOR is None:
        return None
    try:
        span_context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    except (TypeError, ValueError, AttributeError):  # a carrier that is no trace context
        return None
    return trace.Link(span_context) if span_context.is_valid else None


def run_span(
    job_id: int, task: str, queue: str, attempt: int, trace_context: Mapping[str, str] | None
) -> contextlib.AbstractContextManager[Any]:
    """The span of one run of a job, current for the block, which gives the span (``None``
    without OpenTelemetry). Named ``run <task>``, of kind CONSUMER, linked to ``trace_context``
    (the job's enqueue). The caller records how it ended with :func:`failed` and
    :func:`ended`."""
    if trace is None:
        return contextlib.nullcontext()
    link = _link(trace_context)
    return trace.get_tracer(NAME).start_as_current_span(
        f"run {task}",
        kind=trace.SpanKind.CONSUMER,
        links=[link] if link is not None else None,
        attributes={
            "django_jobs.job.id": job_id,
            "django_jobs.job.task": task,
            "django_jobs.job.queue": queue,
            "django_jobs.job.attempt": attempt,
            "messaging.system": NAME,
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": str(job_id),
        },
        # The executor catches every exception of a job, and says how the run ended itself.
        record_exception=False,
        set_status_on_exception=False,
    )


def failed(span: Any, exc: BaseException, traceback: str) -> None:
    """Record that the job's code raised ``exc`` during the run of ``span``: an exception event
    with its message and ``traceback`` (the attempt's), secrets masked as the attempt's are."""
    if span is not None:
        from django_jobs.sanitize import mask_text

        attributes = {"exception.message": mask_text(str(exc)), "exception.stacktrace": traceback}
        span.record_exception(exc, attributes=attributes)


def ended(span: Any, outcome: str, error: str = "") -> None:
    """Record how the run of ``span`` ended: its outcome (done, error, cancelled), and for an
    error the status ERROR with ``error``, the attempt's error message."""
    if span is None:
        return
    span.set_attribute("django_jobs.job.outcome", outcome)
    if outcome == "error":
        span.set_status(trace.StatusCode.ERROR, error[:1000] or None)


def stopped(span: Any, outcome: str) -> None:
    """End the run of ``span`` (if any) now, as stopped from outside, and flush the spans out:
    the executor is about to die of the supervisor's SIGTERM (a timeout, a cancellation, a lost
    lease, the end of a shutdown's grace), and does not know which; the job's attempt records
    which."""
    if trace is None:
        return
    if span is not None:
        span.set_attribute("django_jobs.job.outcome", outcome)
        span.set_status(trace.StatusCode.ERROR, "stopped by its worker")
        span.end()
    # A batching processor's spans of earlier runs, too.
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        with contextlib.suppress(Exception):
            flush(1000)
