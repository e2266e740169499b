"""The queue as a worker sees it: a few statements behind a small protocol.

:class:`Queue` lists what a worker asks of its queue: claim, finish (alone or together with the
next claim), heartbeat, release, hand back, a running job's progress and log, and the rest.
What only a worker with a database does besides (settling workflows, recovering its earlier
boots, syncing queue limits, firing schedules) is not part of it: see
:mod:`django_jobs.worker.duties`.
:class:`PostgresQueue` sends each as the statements of :mod:`django_jobs.store` over the
worker's one connection; a fake in the unit tests keeps jobs in memory, and another transport
(the HTTP API, :mod:`django_jobs.worker.http_queue`) plugs in here.

:class:`QueueGate` is the one place where the supervisor meets the queue's errors: a failed
call is logged and backed off, never raised. It also keeps the one call that may be in flight
while the loop goes on (a job's finish: :mod:`django_jobs.worker.round_trip`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from django_jobs import store
from django_jobs.progress import Progress
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP, Backoff, first_line, unlogged_note
from django_jobs.store import (
    Beat,
    ClaimedJob,
    Ended,
    HandBack,
    Lease,
    Recorded,
    WorkerInfo,
    db,
)
from django_jobs.store.connection import QueueConnection, is_connection_fatal
from django_jobs.worker.round_trip import RoundTrip

logger = logging.getLogger("django_jobs.worker")

T = TypeVar("T")


class Queue(Protocol):
    """What a worker asks of its queue. Every write is fenced on the job's lease: a lease that
    was lost makes it change nothing, and return ``None`` (``False`` for a release). A method
    raises on a database error; :attr:`broken` then says whether the connection went with it."""

    #: What the queue is, in log lines: "database", "API".
    label: str

    def trouble(self, exc: BaseException) -> str:
        """How log lines name an error of this queue: "database error", "API unreachable"."""
        ...

    @property
    def broken(self) -> bool:
        """Whether the last error closed the connection (an outage, not a failed statement)."""
        ...

    def claim(
        self, worker_id: str, queues: Sequence[str], skip_tasks: Sequence[str], *, wait: float = 0.0
    ) -> ClaimedJob | None:
        """The next ready job, or ``None``. A queue that can (the HTTP API's long polling) waits
        up to ``wait`` seconds for one to become ready; others answer at once."""
        ...

    def finish(self, lease: Lease, outcome: str, **options: Any) -> Ended | None: ...

    def finish_and_claim(
        self,
        lease: Lease,
        outcome: str,
        queues: Sequence[str],
        skip_tasks: Sequence[str],
        **options: Any,
    ) -> tuple[Ended | None, ClaimedJob | None]: ...

    def attempt_outcome(self, lease: Lease) -> str | None: ...

    def record_live(
        self,
        lease: Lease,
        progress: Progress | None,
        log: str | None,
        cursors: dict[str, str] | None = None,
    ) -> Recorded: ...

    def release(self, lease: Lease, reason: str) -> bool: ...

    def hand_back(
        self,
        lease: Lease,
        task: str,
        *,
        give_up_after: float,
        worker_timeout: float,
        seen_since: datetime.datetime | None,
    ) -> HandBack | None: ...

    def heartbeat(
        self, worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int]
    ) -> Beat: ...

    def unregister(self, worker_id: str) -> None: ...

    def close(self) -> None: ...


class PostgresQueue:
    """:class:`Queue` over one PostgreSQL connection (autocommit: every statement is its own
    short transaction), in the statements of :mod:`django_jobs.store`."""

    label = "database"

    def __init__(self, connection: QueueConnection) -> None:
        self.connection = connection

    def trouble(self, exc: BaseException) -> str:
        return "database error"

    @property
    def broken(self) -> bool:
        return self.connection.broken

    def claim(
        self, worker_id: str, queues: Sequence[str], skip_tasks: Sequence[str], *, wait: float = 0.0
    ) -> ClaimedJob | None:
        # No long polling here: an idle worker LISTENs (worker/wakeup.py), or polls.
        with self.connection.cursor() as cursor:
            return store.claim(cursor, worker_id, queues, skip_tasks)

    def finish(self, lease: Lease, outcome: str, **options: Any) -> Ended | None:
        with self.connection.cursor() as cursor:
            return store.finish(cursor, lease, outcome, **options)

    def finish_and_claim(
        self,
        lease: Lease,
        outcome: str,
        queues: Sequence[str],
        skip_tasks: Sequence[str],
        **options: Any,
    ) -> tuple[Ended | None, ClaimedJob | None]:
        with self.connection.cursor() as cursor:
            return store.finish_and_claim(cursor, lease, outcome, queues, skip_tasks, **options)

    def attempt_outcome(self, lease: Lease) -> str | None:
        with self.connection.cursor() as cursor:
            return store.attempt_outcome(cursor, lease)

    def record_live(
        self,
        lease: Lease,
        progress: Progress | None,
        log: str | None,
        cursors: dict[str, str] | None = None,
    ) -> Recorded:
        with self.connection.cursor() as cursor:
            return store.record_live(cursor, lease, progress, log, cursors=cursors)

    def release(self, lease: Lease, reason: str) -> bool:
        with self.connection.cursor() as cursor:
            return store.release(cursor, lease, reason)

    def hand_back(
        self,
        lease: Lease,
        task: str,
        *,
        give_up_after: float,
        worker_timeout: float,
        seen_since: datetime.datetime | None,
    ) -> HandBack | None:
        with self.connection.cursor() as cursor:
            return store.hand_back(
                cursor,
                lease,
                task,
                give_up_after=give_up_after,
                worker_timeout=worker_timeout,
                seen_since=seen_since,
            )

    def heartbeat(
        self, worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int]
    ) -> Beat:
        with self.connection.cursor() as cursor:
            return store.heartbeat(cursor, worker, leases, unwritten)

    def unregister(self, worker_id: str) -> None:
        with self.connection.cursor() as cursor:
            store.unregister_worker(cursor, worker_id)

    def close(self) -> None:
        self.connection.close()


#: What :meth:`QueueGate.call` returns when the call failed.
FAILED: Any = object()


class QueueGate:
    """Every call a worker makes to its queue, and the one backoff they share.

    An outage (the connection broke) backs off every use of the queue, tried again at most
    :data:`~django_jobs.runtime.backoff.OUTAGE_RETRY_CAP` apart, and is reported at once, then
    once a minute. Any other error backs off every use too, unless the call has a backoff of
    its own (an outbox write: one write that keeps failing must not hold back the others).
    """

    def __init__(self, queue: Queue, round_trip: RoundTrip | None = None) -> None:
        self.queue = queue
        # Where :meth:`send` makes its calls while the loop goes on; None: it makes them at once.
        self.round_trip = round_trip
        self.outage = Backoff(OUTAGE_RETRY_CAP)
        self.last_error: BaseException | None = None
        # Whether the last error was an outage or a bounded wait running out: those are retried
        # for as long as it takes.
        self.last_error_transient = False

    def waiting(self) -> bool:
        """Whether the queue is backed off: no call is due yet."""
        return self.outage.waiting()

    @property
    def retry_at(self) -> float:
        return self.outage.retry_at

    @property
    def busy(self) -> bool:
        """Whether a call sent with :meth:`send` is in flight (or not yet handled)."""
        return self.round_trip is not None and self.round_trip.busy

    def fileno(self) -> int | None:
        """What the loop's wait watches for the end of the call in flight, if calls can be."""
        return None if self.round_trip is None else self.round_trip.fileno()

    def collect(self) -> None:
        """Handle the end of the call in flight, if it has come."""
        if self.round_trip is not None:
            self.round_trip.collect(wait=False)

    def settle(self) -> None:
        """Wait for the call in flight, and handle its end: before anything else uses the queue,
        or reads what that call changes (the jobs this worker runs, for a heartbeat)."""
        if self.round_trip is not None:
            while self.round_trip.collect(wait=True):
                pass

    def close(self) -> None:
        """Settle the call in flight; stop the thread that makes them."""
        if self.round_trip is not None:
            self.settle()
            self.round_trip.close()
            self.round_trip = None

    def call(self, description: str, fn: Callable[[], T], *, own_backoff: bool = False) -> T:
        """Return ``fn()``; or, on an error of the queue, log it, back off and return ``FAILED``."""
        self.settle()
        try:
            result = fn()
        except Exception as exc:
            return self._failed(description, exc, own_backoff)
        return self._succeeded(result)

    def send(
        self,
        description: str,
        fn: Callable[[], T],
        then: Callable[[T], None],
        *,
        own_backoff: bool = False,
    ) -> None:
        """Like :meth:`call`, but made while the loop goes on, if this gate can: ``then`` gets
        the result (or ``FAILED``) on the loop's thread, from :meth:`collect` or :meth:`settle`.
        ``fn`` must touch nothing but the queue: it may run on another thread."""
        if self.round_trip is None:
            then(self.call(description, fn, own_backoff=own_backoff))
            return
        self.settle()

        def handle(result: Any, error: BaseException | None) -> None:
            if error is None:
                then(self._succeeded(result))
            elif isinstance(error, Exception):
                then(self._failed(description, error, own_backoff))
            else:
                raise error

        self.round_trip.send(fn, handle)

    def _failed(self, description: str, exc: Exception, own_backoff: bool) -> Any:
        self.last_error = exc
        self.last_error_transient = is_connection_fatal(exc) or db.is_timeout(exc)
        level = logging.WARNING if self.last_error_transient else logging.ERROR
        if own_backoff and not self.queue.broken:
            logger.log(
                level,
                "%s during %s (%s: %s); trying it again later",
                self.queue.trouble(exc),
                description,
                type(exc).__name__,
                first_line(exc),
            )
            return FAILED
        delay = self.outage.failed()
        unlogged = self.outage.complaints.due(exc)
        if unlogged is not None:
            logger.log(
                level,
                "%s during %s (%s: %s); retrying in %.1fs%s",
                self.queue.trouble(exc),
                description,
                type(exc).__name__,
                first_line(exc),
                delay,
                unlogged_note(unlogged),
            )
        return FAILED

    def _succeeded(self, result: T) -> T:
        failures = self.outage.succeeded()
        if failures:
            logger.info("%s reachable again after %d failed attempt(s)", self.queue.label, failures)
        return result
