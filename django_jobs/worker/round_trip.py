"""The round trip in flight: a job's finish (with the next claim) sent from a thread of its own,
so that the supervisor's loop serves its other executors while the database works.

With one connection and one thread, the supervisor and its server process worked strictly in
turn: the loop waited for each finish to commit before it read the next executor's report, and
the server waited for the loop before it got the next statement, so a worker topped out at one
job per (supervisor CPU + server time) however many slots it had. Here the hot write is made on
a thread that only runs that call; psycopg releases the GIL while it waits for the server, so
the loop meanwhile reads reports, starts jobs and queues the next finish. The result comes back
to the loop's thread, where everything else happens: the thread touches nothing of the loop's.

Still one connection (pgbouncer in transaction mode sees the same statements, one transaction
each), and at most one call in flight on it: a second statement would only queue behind the
first on the server. Every other use of the connection (:meth:`QueueGate.call
<django_jobs.worker.postgres_queue.QueueGate.call>`) first waits for the call in flight and
handles its result, so the loop's state (the jobs it runs, the writes it owes) is whole before
a heartbeat reports it or another statement is sent. The thread is woken through a queue and
wakes the loop through a pipe that the loop's wait watches.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import sys
import threading
from collections.abc import Callable
from typing import Any

#: Seconds a thread that waits for the GIL lets the other one run (sys.setswitchinterval).
SWITCH_INTERVAL = 0.0005

#: What handles a call's end, on the loop's thread: its result, or the exception it raised.
Handler = Callable[[Any, BaseException | None], None]


class RoundTrip:
    """At most one call at a time, made on a thread of its own (started at the first call)."""

    def __init__(self) -> None:
        self._reader, self._writer = os.pipe()
        os.set_blocking(self._reader, False)
        self._calls: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._result: tuple[Any, BaseException | None] = (None, None)
        self._handler: Handler | None = None
        self._thread: threading.Thread | None = None

    def fileno(self) -> int:
        """Readable once the call in flight has ended: for the loop's wait."""
        return self._reader

    @property
    def busy(self) -> bool:
        """Whether a call is in flight, or has ended and is not yet handled."""
        return self._handler is not None

    def send(self, fn: Callable[[], Any], handler: Handler) -> None:
        """Make ``fn()`` on the thread; ``handler`` gets its end in :meth:`collect`."""
        assert self._handler is None, "one call in flight at a time"
        if self._thread is None:
            # On a busy worker the loop's thread runs most of the time: after the server's
            # reply, this thread would wait up to the default 5 ms for the GIL (the loop's
            # thread gives it up only when asked to that long), several round trips' worth.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
            self._thread = threading.Thread(
                target=self._serve, name="django-jobs-round-trip", daemon=True
            )
            self._thread.start()
        self._handler = handler
        self._calls.put(fn)

    def collect(self, *, wait: bool) -> bool:
        """Handle the end of the call in flight if it has come (with ``wait``: once it has);
        whether one was handled."""
        handler = self._handler
        if handler is None or not self._ended(wait):
            return False
        result, error = self._result
        self._result = (None, None)
        self._handler = None
        handler(result, error)
        return True

    def _ended(self, wait: bool) -> bool:
        # The thread writes one byte per call, once its result is in place: reading it is how
        # the end is known, so that no byte is left behind to wake the loop's wait for nothing.
        if wait:
            select.select([self._reader], [], [])
        try:
            return bool(os.read(self._reader, 1))
        except BlockingIOError:
            return False

    def close(self) -> None:
        """Stop the thread (after the call in flight, handled or not) and close the pipe."""
        if self._thread is not None:
            self._calls.put(None)  # after the call in flight, if there is one
            self._thread.join(timeout=5.0)
            self._thread = None
        for fd in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _serve(self) -> None:
        while True:
            fn = self._calls.get()
            if fn is None:
                return
            try:
                self._result = (fn(), None)
            except BaseException as error:  # handed to the loop's thread, which raises it there
                self._result = (None, error)
            os.write(self._writer, b"\0")
