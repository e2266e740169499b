"""Inside an executor: a job's printed and logged output, copied to the supervisor as it is
written.

During an attempt, ``sys.stdout`` and ``sys.stderr`` are tees: what the job prints still goes
where it went before (the worker's log), and a copy goes down the executor's output pipe. So
do the job's log records at ``JOBS_CAPTURE_LOG_LEVEL`` and above, formatted one per line, from
every logger but the worker's own. The copy is masked here, in the executor, a line at a time
(:class:`MaskedLines`), so that the supervisor, which keeps the attempt's tail (worker/live.py),
never masks anything. Each line reaches the pipe once it ends, before the write that ends it
returns, so what a job wrote before it crashed or was killed is already with the supervisor, but
for a last line it had not ended.

Capture changes nothing the job would otherwise see or print, except that each line it prints
reaches the worker's output with the job's id in front (``[job 42] ``), so that the jobs' lines
can be told apart among the worker's; the captured copy has no such prefix. To capture records
below the level the job's loggers let through (Django leaves the root logger at WARNING), the root
logger is lowered for the attempt, and every handler that was there before gets a filter that keeps
its old threshold; a record that no handler would have taken still goes to Python's last-resort
handler, as it did.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Protocol, TextIO

from django_jobs.conf import sensitive_keys
from django_jobs.sanitize import mask_text

#: The worker's own log records are the worker's, not the job's; this one is the job's (bad
#: progress reports, see context.py).
JOB_LOGGER = "django_jobs.job"

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Sink:
    """The executor's end of its output pipe: raw bytes, written before ``write`` returns."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.broken = False
        #: Bytes written so far, in all (see ``Report.output_bytes``, worker/executor.py).
        self.written = 0

    def write(self, text: str) -> None:
        if text:
            self.write_bytes(text.encode("utf-8", "backslashreplace"))

    def write_bytes(self, data: bytes) -> None:
        if self.broken or not data:
            return
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except InterruptedError:
                continue
            except OSError:
                self.broken = True  # the supervisor is gone: the job goes on regardless
                return
            self.written += written
            view = view[written:]


class Output(Protocol):
    """Where a tee copies what the job writes: a :class:`Sink`, or :class:`MaskedLines`."""

    def write(self, text: str) -> None: ...

    def write_bytes(self, data: bytes) -> None: ...


#: Characters a line may end with (before its newline, and white space) for the next line to
#: hold its value: ``password:`` then ``  hunter2`` on the next line.
_OPEN_ENDS = (":", "=")


class MaskedLines:
    """The job's output on its way to the :class:`Sink`, masked a line at a time (see
    :mod:`django_jobs.sanitize`), in the executor, where it is written.

    Masking needs whole lines: ``print("password=" + pw, "!")`` writes three times, and a secret
    can span two writes. So a line goes down the pipe when it ends (at ``\n`` or ``\r``); the
    start of one waits for
    its end, for at most ``hold`` characters (a line longer than the kept tail is left out of
    the stored log anyway, see log_tail.py), or until the attempt ends (:meth:`flush`). A line
    that ends open (``password:``) waits for the next one, which may hold its value. Bytes
    written to the streams' buffers are decoded as UTF-8 (invalid bytes as U+FFFD). Each
    character is masked once, in time linear in the output."""

    def __init__(self, sink: Sink, hold: int) -> None:
        self.sink = sink
        self.hold = max(1, hold)
        # Read once per attempt: reading settings costs more than masking a short line.
        self.keys = sensitive_keys()
        self.pending: list[str] = []
        self.pending_chars = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # The job's threads may print at once. Reentrant: a signal handler of the job that prints
        # runs in the thread it interrupted, which may hold the lock.
        self.lock = threading.RLock()

    def write(self, text: str) -> None:
        if text and not self.sink.broken:
            with self.lock:
                self._add(self._undecoded() + text)

    def write_bytes(self, data: bytes) -> None:
        if data and not self.sink.broken:
            with self.lock:
                self._add(self.decoder.decode(data))

    def flush(self) -> None:
        """Send what waits, line ended or not: the attempt is ending."""
        with self.lock:
            self._add(self._undecoded())
            self._send("".join(self.pending))

    def _undecoded(self) -> str:
        # The start of a character written as bytes, before text: as U+FFFD, as before.
        text = self.decoder.decode(b"", final=True)
        self.decoder.reset()
        return text

    def _add(self, text: str) -> None:
        if not text:
            return
        # A carriage return ends a line too: a progress bar redrawn in place shows as it goes.
        newline = max(text.rfind("\n"), text.rfind("\r"))
        if newline < 0:
            self.pending.append(text)
            self.pending_chars += len(text)
            if self.pending_chars > self.hold:
                self._send("".join(self.pending))
            return
        self.pending.append(text[: newline + 1])
        ended = "".join(self.pending)
        rest = text[newline + 1 :]
        self.pending, self.pending_chars = [], 0
        if ended.rstrip().endswith(_OPEN_ENDS) and len(ended) + len(rest) <= self.hold:
            # Its last line may have its value on the next: keep that line back, with it.
            content = len(ended.rstrip("\r\n"))
            start = max(ended.rfind("\n", 0, content), ended.rfind("\r", 0, content)) + 1
            ended, rest = ended[:start], ended[start:] + rest
        self._send(ended)
        if rest:
            self.pending.append(rest)
            self.pending_chars = len(rest)

    def _send(self, text: str) -> None:
        self.pending, self.pending_chars = [], 0
        if text:
            self.sink.write(mask_text(text, self.keys))


class LineStarts:
    """Whether the worker's stream is at the start of a line, shared by its text and its bytes,
    so that each line a job prints there starts with the job's id once."""

    def __init__(self, prefix: str) -> None:
        self.text = prefix
        self.bytes = prefix.encode()
        self.at_start = True

    def text_lines(self, text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            if self.at_start:
                out.append(self.text)
            out.append(line)
            self.at_start = line.endswith("\n")
        return "".join(out)

    def byte_lines(self, data: bytes) -> bytes:
        out = []
        for line in data.splitlines(keepends=True):
            if self.at_start:
                out.append(self.bytes)
            out.append(line)
            self.at_start = line.endswith(b"\n")
        return b"".join(out)


class Tee:
    """A text stream that also copies what is written to a :class:`Sink`; its ``buffer`` (the
    bytes under ``sys.stdout``) copies what is written there too. With ``starts``, what goes to
    the stream has the job's id at the start of each line."""

    def __init__(self, stream: TextIO, sink: Output, starts: LineStarts | None = None) -> None:
        self._stream = stream
        self._sink = sink
        self._starts = starts
        self._buffer: BufferTee | None = None

    @property
    def buffer(self) -> BufferTee:
        if self._buffer is None:
            self._buffer = BufferTee(self._stream, self._sink, self._starts)
        return self._buffer

    def write(self, text: str) -> int:
        shown = text if self._starts is None else self._starts.text_lines(text)
        self._stream.write(shown)
        self._sink.write(text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # flush, fileno, encoding, isatty, ...


class BufferTee:
    """``sys.stdout.buffer`` (or stderr's) during an attempt: bytes written there go where they
    went before, and a copy goes down the pipe."""

    def __init__(self, stream: TextIO, sink: Output, starts: LineStarts | None = None) -> None:
        self._stream = stream
        self._raw = stream.buffer  # AttributeError where the stream has none, as before
        self._sink = sink
        self._starts = starts

    def write(self, data: Any) -> int:
        # Text printed before these bytes was copied when it was written; the stream's own
        # order is its business, as without capture.
        data = bytes(data)
        self._raw.write(data if self._starts is None else self._starts.byte_lines(data))
        self._sink.write_bytes(data)
        return len(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)  # flush, fileno, raw, ...


def _is_workers(record: logging.LogRecord) -> bool:
    name = record.name
    return (name == "django_jobs" or name.startswith("django_jobs.")) and name != JOB_LOGGER


def _old_threshold(name: str, root_level: int) -> int:
    """The effective level the logger ``name`` had before the root logger was lowered."""
    logger: Any = logging.getLogger(name)
    while logger is not None and logger is not logging.root:
        if logger.level:
            return int(logger.level)
        logger = logger.parent
    return root_level


def _handled_elsewhere(record: logging.LogRecord, mine: logging.Handler) -> bool:
    """Whether a handler other than ``mine`` is on the way of ``record`` up the loggers."""
    logger: Any = logging.getLogger(record.name)
    while logger is not None:
        if any(handler is not mine for handler in logger.handlers):
            return True
        logger = logger.parent if logger.propagate else None
    return False


class _OldThreshold(logging.Filter):
    """On the handlers that were there before: pass only what they would have received."""

    def __init__(self, root_level: int) -> None:
        super().__init__()
        self.root_level = root_level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= _old_threshold(record.name, self.root_level)


class CaptureHandler(logging.Handler):
    """Writes the job's log records to the sink, one line each."""

    def __init__(self, sink: Output, level: int, stderr: TextIO, root_level: int) -> None:
        super().__init__(level)
        self.sink = sink
        self.setFormatter(logging.Formatter(FORMAT))
        # Python's last resort, for a record no other handler takes (it would have printed it).
        self.last_resort = logging.StreamHandler(stderr)
        self.last_resort.setLevel(logging.lastResort.level if logging.lastResort else 100)
        self.root_level = root_level

    def handle(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno >= _old_threshold(record.name, self.root_level)
            and not _handled_elsewhere(record, self)
            and logging.lastResort is not None
        ):
            self.last_resort.handle(record)
        if _is_workers(record):
            return False
        return bool(super().handle(record))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def _handlers() -> set[logging.Handler]:
    found = set(logging.root.handlers)
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            found.update(logger.handlers)
    return found


@contextlib.contextmanager
def captured(
    sink: Sink | None, level: int, hold: int = 64 * 1024, prefix: str = ""
) -> Iterator[None]:
    """Copy what the job prints and logs to ``sink``, masked, while the block runs (``None``:
    don't); ``hold`` is the longest unended line kept back to be masked whole. What the job
    prints still goes to the worker's output, each line starting with ``prefix``."""
    if sink is None:
        yield
        return
    masked = MaskedLines(sink, hold)
    root = logging.root
    root_level = root.level
    stdout, stderr = sys.stdout, sys.stderr
    handler = CaptureHandler(masked, level, stderr, root_level)
    floor = _OldThreshold(root_level)
    lowered = _handlers() if level < root_level else set()
    for other in lowered:
        other.addFilter(floor)
    if lowered or level < root_level:
        root.setLevel(level)
    root.addHandler(handler)
    out_starts = LineStarts(prefix) if prefix else None
    err_starts = LineStarts(prefix) if prefix else None
    sys.stdout, sys.stderr = Tee(stdout, masked, out_starts), Tee(stderr, masked, err_starts)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        root.removeHandler(handler)
        root.setLevel(root_level)
        for other in lowered:
            other.removeFilter(floor)
        masked.flush()
