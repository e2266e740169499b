"""Long polling without a herd: one LISTEN per process, each notification handed to one request.

A claim that finds nothing may wait for work (its ``wait``). It waits as a :class:`Waiter`,
holding no database connection. The process's one :class:`Dispatcher` thread LISTENs on the
channel that enqueues notify (the payload is the queue that has work) and hands each
notification to *one* waiter serving that queue, the one that has waited longest; that waiter
claims once. So a job enqueued while a thousand requests wait costs one claim, not a thousand.

What keeps a wake-up from being lost:

- a waiter joins before its first claim, so a notification that comes while it claims is kept
  for it (counted in ``wakes``), and it claims again;
- a woken waiter that got a job passes one wake on (a notification is sent once per
  enqueueing transaction, which may have enqueued many jobs): the chain ends with the first
  claim that finds nothing. Wakes it was handed while claiming are passed on too;
- every ``JOBS_POLL_INTERVAL`` the dispatcher asks, in one statement for all its idle waiters
  (``ready_queues``), which of the queues they wait on have a ready job, and wakes one idle
  waiter for each such queue: the work no notification announces (a retry's delay or a
  ``run_after`` that has come, a queue resumed, a concurrency slot freed) is found, and idle
  waiters cost one statement a tick, however many sets of queues they wait on. While the LISTEN
  connection is down, these ticks are the polling that finds every job. If that statement
  fails, the tick wakes one waiter of each distinct set of queues instead, which claims.

A notification is only a hint: a woken waiter claims with the same fenced statement as any
worker, and a claim that finds nothing just waits again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import select
import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg

from django_jobs import conf
from django_jobs.api import operations, thread_pool
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP, Backoff, Complaints, first_line
from django_jobs.store.connection import connection_params
from django_jobs.store.sql import query

logger = logging.getLogger("django_jobs.api")

#: What a wake that came from a tick, not a notification, is for: any queue of the waiter.
ANY = ""


class Waiter:
    """One claim request that waits for work, in its event loop."""

    def __init__(self, queues: Iterable[str] | None) -> None:
        self.queues = frozenset(queues) if queues else None
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        #: The queues of the wakes handed to this waiter since its last claim began.
        self.wakes: list[str] = []

    def serves(self, queue: str) -> bool:
        return queue == ANY or self.queues is None or queue in self.queues

    async def wait(self, timeout: float, hangup: asyncio.Future[Any] | None = None) -> None:
        """Until woken, or ``timeout`` seconds, or ``hangup`` (the client hung up) is done."""
        woken = asyncio.ensure_future(self.event.wait())
        watched: set[asyncio.Future[Any]] = {woken}
        if hangup is not None:
            watched.add(hangup)
        try:
            await asyncio.wait(watched, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()


class Dispatcher:
    """The waiters of this process, and the thread that wakes them (``listen``: started with
    the first waiter; the unit tests drive :meth:`notify` and :meth:`tick` themselves)."""

    def __init__(self, *, listen: bool = True) -> None:
        self.listen = listen
        self._lock = threading.Lock()
        # Insertion-ordered: the first is the one that has waited longest.
        self._waiters: dict[Waiter, None] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.listening = False
        #: Wakes handed out, and notifications read (for tests and the benchmark).
        self.handed = 0
        self.notifications = 0
        self.complaints = Complaints()

    # ------------------------------------------------------------------ requests' side

    def join(self, queues: Iterable[str] | None) -> Waiter:
        """A new waiter (call it before the request's first claim)."""
        waiter = Waiter(queues)
        with self._lock:
            self._waiters[waiter] = None
        if self.listen:
            self._ensure_thread()
        return waiter

    def take(self, waiter: Waiter) -> list[str]:
        """The wakes the claim that ``waiter`` is about to make answers (it begins after them)."""
        with self._lock:
            wakes, waiter.wakes = waiter.wakes, []
            waiter.event.clear()
        return wakes

    def pending(self, waiter: Waiter) -> bool:
        with self._lock:
            return bool(waiter.wakes)

    def leave(self, waiter: Waiter, pass_on: Iterable[str] = ()) -> None:
        """``waiter`` is done; wake others for ``pass_on`` and for what it was handed and did
        not claim for."""
        with self._lock:
            self._waiters.pop(waiter, None)
            queues = [*pass_on, *waiter.wakes]
            waiter.wakes = []
            for queue in queues:
                self._wake_one(queue)

    # ------------------------------------------------------------------ the thread's side

    def notify(self, queue: str) -> None:
        with self._lock:
            self.notifications += 1
            self._wake_one(queue)

    def wanted(self) -> tuple[list[str], bool] | None:
        """What a tick asks ``ready_queues`` about: the queues the idle waiters (those not
        woken already) wait on, and whether one of them waits on every queue; None when no
        waiter is idle."""
        with self._lock:
            queues: set[str] = set()
            any_queue = idle = False
            for waiter in self._waiters:
                if waiter.wakes:
                    continue
                idle = True
                if waiter.queues is None:
                    any_queue = True
                else:
                    queues.update(waiter.queues)
        return (sorted(queues), any_queue) if idle else None

    def ready(self, queues: Iterable[str]) -> None:
        """The answer of ``ready_queues``: wake one idle waiter for each queue that has a ready
        job (``ANY``: one of those that wait on every queue), unless one serving it was woken
        already (its claim, or the one it passes on, takes the job)."""
        with self._lock:
            claiming = [w for w in self._waiters if w.wakes]
            for queue in sorted(queues):

                def serves(w: Waiter, queue: str = queue) -> bool:
                    # Those of every queue are woken for ANY, those of a set for its queues.
                    return w.queues is None if queue == ANY else queue in (w.queues or ())

                if any(serves(w) for w in claiming):
                    continue
                idle = next((w for w in self._waiters if not w.wakes and serves(w)), None)
                if idle is not None:
                    self._hand(idle, queue)

    def tick(self) -> None:
        """Wake one waiter of each distinct set of queues that has none woken already (what a
        tick does when ``ready_queues`` cannot be asked)."""
        with self._lock:
            groups: dict[frozenset[str] | None, Waiter] = {}
            woken: set[frozenset[str] | None] = set()
            for waiter in self._waiters:
                if waiter.wakes:
                    woken.add(waiter.queues)
                else:
                    groups.setdefault(waiter.queues, waiter)
            for queues, waiter in groups.items():
                if queues not in woken:
                    self._hand(waiter, ANY)

    def _wake_one(self, queue: str) -> None:
        # The longest-waiting idle waiter that serves the queue; if every one of them is busy
        # claiming already, one of those claims again after its claim.
        busy = None
        for waiter in self._waiters:
            if waiter.serves(queue):
                if not waiter.wakes:
                    self._hand(waiter, queue)
                    return
                busy = busy or waiter
        if busy is not None:
            self._hand(busy, queue)

    def _hand(self, waiter: Waiter, queue: str) -> None:
        self.handed += 1
        waiter.wakes.append(queue)
        # Last in the line: the next wake of the same queue goes to another waiter.
        self._waiters.pop(waiter, None)
        self._waiters[waiter] = None
        with contextlib.suppress(RuntimeError):  # its loop closed: the request is gone
            waiter.loop.call_soon_threadsafe(waiter.event.set)

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="django-jobs-api-listen", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        listener = Listener()
        interval = conf.poll_interval()
        next_tick = time.monotonic() + interval
        checking: concurrent.futures.Future[set[str]] | None = None
        try:
            while not self._stop.is_set():
                listener.ensure()
                self.listening = listener.conn is not None
                timeout = max(0.0, min(next_tick - time.monotonic(), 0.5))
                for queue in listener.read(timeout):
                    self.notify(queue)
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + interval
                    if checking is None or checking.done():
                        checking = self._check()
        finally:
            listener.close()
            self.listening = False

    def _check(self) -> concurrent.futures.Future[set[str]] | None:
        """Ask ``ready_queues`` in a thread of the API's pool (with the store's bounded waits)
        for this tick's idle waiters; their wakes come with its answer."""
        wanted = self.wanted()
        if wanted is None:
            return None
        checking = thread_pool.submit(operations.ready_queues, *wanted)

        def answered(done: concurrent.futures.Future[set[str]]) -> None:
            try:
                found = done.result()
            except Exception as exc:
                if self.complaints.due(exc) is not None:
                    logger.warning(
                        "API long polls: the ready check failed (%s); each set of queues claims",
                        first_line(exc) or type(exc).__name__,
                    )
                self.tick()
                return
            self.ready(found)

        checking.add_done_callback(answered)
        return checking


class Listener:
    """The process's LISTEN connection, reconnected with backoff (never raises)."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self.backoff = Backoff(OUTAGE_RETRY_CAP)

    def ensure(self) -> None:
        if self.conn is not None or self.backoff.waiting():
            return
        try:
            url = conf.listen_database_url()
            name = "django-jobs-api-listen"
            if url:
                conn = psycopg.connect(url, autocommit=True, application_name=name)
            else:
                conn = psycopg.connect(**connection_params(conf.database_alias(), name))
            conn.execute(query("listen_for_jobs"))
            self.conn = conn
        except Exception as exc:
            self._failed(exc)
            return
        if self.backoff.succeeded():
            logger.info("API LISTEN connection is back")

    def read(self, timeout: float) -> list[str]:
        """The queues of the notifications that come within ``timeout`` seconds."""
        if self.conn is None:
            time.sleep(timeout)
            return []
        try:
            pgconn = self.conn.pgconn
            ready, _, _ = select.select([pgconn.socket], [], [], timeout)
            if not ready:
                return []
            pgconn.consume_input()
            queues = []
            while (note := pgconn.notifies()) is not None:
                queues.append(note.extra.decode(errors="replace"))
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("LISTEN connection closed")
            return queues
        except Exception as exc:
            self._failed(exc)
            return []

    def _failed(self, exc: BaseException) -> None:
        self.close()
        delay = self.backoff.failed()
        if self.backoff.complaints.due(exc) is not None:
            logger.warning(
                "API LISTEN connection unavailable (%s); polling every JOBS_POLL_INTERVAL,"
                " reconnecting in %.1fs",
                first_line(exc) or type(exc).__name__,
                delay,
            )

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


dispatcher = Dispatcher()
