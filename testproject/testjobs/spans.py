"""Spans written out as JSON lines, for the tests of traces (tests/system/test_tracing.py).

With ``TESTJOBS_SPANS_FILE`` set, every process of the test project (a worker's supervisor, its
executors, the HTTP API's server) configures the global tracer provider at start-up to append
each span it ends to that file, one line each, as a user's settings would configure an exporter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

#: The file the spans go to.
VARIABLE = "TESTJOBS_SPANS_FILE"


def plain(span: ReadableSpan) -> dict[str, Any]:
    """What the tests read of a span."""
    context, parent = span.get_span_context(), span.parent
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "events": [
            {"name": event.name, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    """Appends each span to ``path`` as a line of JSON, in one write: the processes of a worker
    share the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(plain(span)) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def configure_from_environment() -> None:
    """Export this process's spans to the file ``TESTJOBS_SPANS_FILE`` names, if it is set."""
    path = os.environ.get(VARIABLE)
    if not path:
        return
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


def read(path: str) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
