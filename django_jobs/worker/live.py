"""What the supervisor knows of each running attempt before it ends, and writes while it runs:
the last progress its job reported, the cursors it saved, and the tail of what it printed and
logged.

An executor sends progress and cursor saves over its pipe, and its output down a second pipe as
it is written (worker/capture.py); the pool keeps them in the slot's :class:`Watch`.
:class:`LiveWrites` turns a watch into ``record_live`` writes (store/live_attempts.py), queued in
the outbox on the worker's one connection: at most one per ``JOBS_PROGRESS_INTERVAL`` per job
while it runs (per ``JOBS_CURSOR_INTERVAL`` when a cursor was saved), each with the latest
values, and always one more when the attempt ends, queued before its finish or its release. A
cursor save is so never lost when the job ends or is released at shutdown; a worker killed
outright loses at most the saves of one cursor interval.
Since the tail is kept here, a job whose process crashed or was killed for a timeout keeps
what it had written up to then (but for a line it had not ended: see worker/capture.py).

The output arrives masked: the executor masks it as it is written. The supervisor only keeps
its last bytes and decodes them for each live write, in time linear in the tail, so no output
can make its loop mask, or stall on, anything.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from django_jobs.log_tail import kept_text
from django_jobs.progress import Progress
from django_jobs.store import Lease, Recorded
from django_jobs.worker.outbox import Outbox, Write
from django_jobs.worker.postgres_queue import Queue


class Tail:
    """The last ``limit`` bytes of an attempt's output, and how many came before them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.cut = 0
        #: Whether the kept bytes start a line: the last byte cut was a newline.
        self.at_line_start = True

    def add(self, data: bytes) -> None:
        self.buffer += data
        excess = len(self.buffer) - self.limit
        if excess > 0:
            self.at_line_start = self.buffer[excess - 1] == ord("\n")
            del self.buffer[:excess]
            self.cut += excess

    def text(self) -> str:
        """The tail as stored: from a line start, after a marker if the start was cut. The
        bytes came masked from the executor (worker/capture.py): nothing is masked here, on
        the supervisor's loop (see log_tail.py)."""
        return kept_text(bytes(self.buffer), self.cut, self.at_line_start, self.limit)


@dataclasses.dataclass(eq=False)
class Watch:
    """One running attempt, as its executor reports it."""

    lease: Lease
    tail: Tail
    progress: Progress | None = None
    # Cursors saved since the last write began, and those of a write in flight (sent again, with
    # any newer values, if the outbox tries it again); name -> the value's JSON text.
    unwritten: dict[str, str] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, str] = dataclasses.field(default_factory=dict)
    # Each report bumps a version; a write records the versions it wrote.
    progress_version: int = 0
    log_version: int = 0
    cursor_version: int = 0
    written: tuple[int, int, int] = (0, 0, 0)
    # When the last live write of this attempt was queued, and that write.
    queued_at: float = float("-inf")
    pending: Write | None = None

    def reported(self, progress: Progress) -> None:
        self.progress = progress
        self.progress_version += 1

    def saved(self, cursors: dict[str, str]) -> None:
        self.unwritten.update(cursors)
        self.cursor_version += 1

    def printed(self, data: bytes) -> None:
        if data and self.tail.limit:
            self.tail.add(data)
            self.log_version += 1

    @property
    def changed(self) -> bool:
        return (self.progress_version, self.log_version, self.cursor_version) != self.written

    def due_after(self, interval: float, cursor_interval: float) -> float:
        """Seconds after the last write that the next is due: a cursor saved since makes it
        due sooner."""
        if self.cursor_version != self.written[2]:
            return min(interval, cursor_interval)
        return interval


class LiveWrites:
    """Writes of running attempts' progress and logs, one per job per ``interval`` at most."""

    def __init__(
        self,
        db: Queue,
        outbox: Outbox,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        cursor_interval: float | None = None,
    ) -> None:
        self.db = db
        self.outbox = outbox
        self.interval = interval
        self.cursor_interval = interval if cursor_interval is None else cursor_interval
        self.clock = clock

    def due_at(self, watches: Iterable[Watch]) -> float | None:
        """When (monotonic) the next live write is due, if one is."""
        return min(
            (
                w.queued_at + w.due_after(self.interval, self.cursor_interval)
                for w in watches
                if w.changed and not self._queued(w)
            ),
            default=None,
        )

    def step(self, watches: Iterable[Watch]) -> None:
        """Queue a write for each attempt that reported something, unless it had one within
        the interval or has one queued still."""
        now = self.clock()
        for watch in watches:
            if (
                watch.changed
                and not self._queued(watch)
                and now >= watch.queued_at + watch.due_after(self.interval, self.cursor_interval)
            ):
                self._queue(watch, now)

    def last(self, watch: Watch | None) -> None:
        """Queue the attempt's last values, whatever the interval: its attempt is ending (call
        it before its finish is queued)."""
        if watch is not None and watch.changed:
            self._queue(watch, self.clock())

    def _queued(self, watch: Watch) -> bool:
        # A write the outbox gave up on is no longer queued.
        return watch.pending is not None and watch.pending in self.outbox.writes

    def _queue(self, watch: Watch, now: float) -> None:
        versions = watch.written

        def run() -> Recorded:
            # The latest values when the write is made, not when it was queued.
            nonlocal versions
            versions = (watch.progress_version, watch.log_version, watch.cursor_version)
            progress = watch.progress if versions[0] != watch.written[0] else None
            log = watch.tail.text() if versions[1] != watch.written[1] else None
            if watch.unwritten:
                watch.in_flight = {**watch.in_flight, **watch.unwritten}
                watch.unwritten = {}
            if watch.in_flight:
                return self.db.record_live(watch.lease, progress, log, watch.in_flight)
            return self.db.record_live(watch.lease, progress, log)

        def then(_: Recorded) -> None:
            watch.written = versions
            watch.in_flight = {}

        watch.queued_at = now
        watch.pending = Write(f"record progress of job {watch.lease.job_id}", run, then)
        self.outbox.add(watch.pending)
