"""The worker's log lines, written by a thread of their own, off the supervisor's loop.

A worker's log and its jobs' output usually share one destination: the executors' stdout and
stderr are the worker's (worker/capture.py copies a job's output there, as well as to the
supervisor). When that destination drains slowly (a container runtime's log pipe under a job
printing megabytes, a stuck log shipper), a write to it blocks until there is room; a supervisor
writing its own log line there would stop with it, heartbeats included, until the executors'
flood had drained, and its executors would fence themselves (worker/fence.py). So while
:class:`BackgroundLog` is in force, the records of the ``django_jobs`` loggers are put in a
bounded queue, and a thread hands them to the handlers that would have had them. A record that
finds the queue full is dropped and counted, and the thread says how many were dropped once it
can write again: a blocked log costs log lines, never heartbeats.
"""

from __future__ import annotations

import logging
import queue
import threading
from types import TracebackType

#: Records waiting to be written, at most; more are dropped (and counted) while the output is
#: blocked.
CAPACITY = 10_000

#: Seconds the worker waits, on its way out, for the records still queued to be written.
FLUSH_TIMEOUT = 10.0


class _Enqueue(logging.Handler):
    def __init__(self, records: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__()
        self.records = records
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        # The message is made now, from the arguments as they are now.
        record.msg = record.getMessage()
        record.args = None
        try:
            self.records.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class BackgroundLog:
    """Write the records of ``logger`` (and its children) from a thread, with what were its
    handlers (and, if it propagated, its ancestors')."""

    def __init__(self, logger: str = "django_jobs", capacity: int = CAPACITY) -> None:
        self.logger = logging.getLogger(logger)
        self.records: queue.Queue[logging.LogRecord | None] = queue.Queue(capacity)
        self.enqueue = _Enqueue(self.records)
        self.handlers: list[logging.Handler] = []
        self.propagate = True
        self.thread = threading.Thread(target=self._write, name="django-jobs-log", daemon=True)

    def __enter__(self) -> BackgroundLog:
        self.handlers, self.propagate = list(self.logger.handlers), self.logger.propagate
        self.logger.handlers = [self.enqueue]
        self.logger.propagate = False
        self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.logger.handlers, self.logger.propagate = self.handlers, self.propagate
        try:
            self.records.put(None, timeout=FLUSH_TIMEOUT)
        except queue.Full:
            return  # the output is blocked for good: don't hang the exit on it
        self.thread.join(FLUSH_TIMEOUT)

    def _write(self) -> None:
        while (record := self.records.get()) is not None:
            self._handle(record)
            dropped, self.enqueue.dropped = self.enqueue.dropped, 0
            if dropped:
                note = logging.LogRecord(
                    self.logger.name,
                    logging.WARNING,
                    __file__,
                    0,
                    f"{dropped} log record(s) of this worker were dropped: its log output was"
                    " blocked (a slow log reader, or a job printing faster than it drains)",
                    None,
                    None,
                )
                self._handle(note)

    def _handle(self, record: logging.LogRecord) -> None:
        # What Logger.callHandlers does, from the logger's former handlers up.
        for handler in self.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
        if not self.propagate:
            return
        parent = self.logger.parent
        while parent is not None:
            for handler in parent.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            if not parent.propagate:
                break
            parent = parent.parent
