"""The executor pool: long-lived executor processes, one job at a time each, over pipes.

The pool spawns the executors, hands them jobs, keeps what each running job reports and prints
in its slot's :class:`~django_jobs.worker.live.Watch`, stops them (a timeout, a cancellation, a lost
lease, the end of the shutdown grace period: SIGTERM, then SIGKILL after ``JOBS_KILL_GRACE``)
and turns what they say and how they exit into events for the supervisor. It never talks to
the queue: what a report or an exit means for the job is the supervisor's to write.

``spawn`` (:mod:`django_jobs.worker.spawn`) and ``wait`` are the pool's seams to the operating
system: the unit tests pass fake executors that live in the test's own process. Its slots and
events are in :mod:`django_jobs.worker.slots`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import pickle
import select
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django_jobs import conf
from django_jobs.progress import Progress
from django_jobs.store import ClaimedJob, Lease
from django_jobs.worker.executor import Assignment, CursorSaves, Report
from django_jobs.worker.fence import FENCED, Fence
from django_jobs.worker.live import Tail, Watch
from django_jobs.worker.observer import Observer
from django_jobs.worker.outcomes import job_fields
from django_jobs.worker.slots import (
    STOP_LEASE_LOST,
    STOP_SHUTDOWN,
    STOP_TIMEOUT,
    Event,
    Exited,
    Reported,
    Slot,
)
from django_jobs.worker.spawn import Spawned, spawn_executor

logger = logging.getLogger("django_jobs.worker")

#: Bytes of a job's output read at a time, and at most in one look (the rest waits for the next).
OUTPUT_CHUNK = 64 * 1024
OUTPUT_READ_LIMIT = 1024 * 1024


#: The longest timeout poll(2) takes, in milliseconds (24 days).
_LONGEST_POLL_MS = 2**31 - 1


class Poller:
    """:func:`multiprocessing.connection.wait` for the supervisor's loop, which waits once per
    turn on the same pipes, sentinels and sockets: the poll set is kept from one wait to the
    next, and made again only when what is waited on changes (an executor replaced, the LISTEN
    connection made again), where ``wait`` would build a selector and register each of them
    every time."""

    def __init__(self) -> None:
        self._waitables: list[Any] = []
        self._poll = select.poll()
        self._by_fd: dict[int, Any] = {}

    def __call__(self, waitables: list[Any], timeout: float) -> list[Any]:
        if waitables != self._waitables:
            self._poll = select.poll()
            self._by_fd = {}
            for waitable in waitables:
                fd = waitable if isinstance(waitable, int) else waitable.fileno()
                self._poll.register(fd, select.POLLIN)
                self._by_fd[fd] = waitable
            self._waitables = waitables
        # As a selector rounds it: never wake before the timeout only to wait again.
        ms = min(math.ceil(timeout * 1e3), _LONGEST_POLL_MS) if timeout > 0 else 0
        by_fd = self._by_fd
        return [by_fd[fd] for fd, _ in self._poll.poll(ms)]


class ExecutorPool:
    """``size`` executors, each in a :class:`Slot`."""

    def __init__(
        self,
        size: int,
        *,
        kill_grace: float | None = None,
        observer: Observer | None = None,
        spawn: Callable[[int], Spawned] | None = None,
        wait: Callable[[list[Any], float], list[Any]] | None = None,
    ) -> None:
        self.size = size
        self.kill_grace = conf.kill_grace() if kill_grace is None else kill_grace
        self.observer = observer or Observer()
        #: When the supervisor's last committed heartbeat was sent, as the executors see it.
        self.fence = Fence(conf.worker_timeout(), self.kill_grace)
        self._spawn_process = spawn or functools.partial(spawn_executor, fence=self.fence)
        self._wait = wait or Poller()
        self.slots: list[Slot] = []
        self.log_bytes = conf.attempt_log_bytes()

    def start(self) -> None:
        self.slots = [self._spawn(i) for i in range(self.size)]

    def _spawn(self, index: int) -> Slot:
        process, conn, output = self._spawn_process(index)
        return Slot(index=index, process=process, conn=conn, output=output)

    # ------------------------------------------------------------------ the slots

    def free_slot(self) -> Slot | None:
        return next((s for s in self.slots if s.ready and not s.busy), None)

    def free_slots(self) -> int:
        return sum(1 for s in self.slots if s.ready and not s.busy)

    def busy(self) -> int:
        return sum(1 for slot in self.slots if slot.busy)

    def holder(self, job_id: int) -> Slot | None:
        """The slot running ``job_id``, if any."""
        return next((s for s in self.slots if s.job is not None and s.job.id == job_id), None)

    def leases(self) -> list[Lease]:
        """The leases of every job the pool runs or is about to start."""
        return [
            job.lease for slot in self.slots for job in (slot.job, slot.deferred) if job is not None
        ]

    def watches(self) -> list[Watch]:
        """What each running job has reported so far."""
        return [slot.watch for slot in self.slots if slot.watch is not None]

    def fenced(self, slot: Slot) -> bool:
        """Whether ``slot``'s executor stopped its job itself, because the supervisor's
        heartbeats had stopped committing (worker/fence.py)."""
        stop_requested = getattr(slot.process, "stop_requested", None)
        return stop_requested is not None and stop_requested.value == FENCED

    def running(self) -> list[Slot]:
        """The slots whose job runs, and is not being stopped."""
        return [s for s in self.slots if s.job is not None and s.stop_reason is None]

    def next_deadline(self) -> float | None:
        """The soonest moment (monotonic) a running job times out, or an executor is killed."""
        moments = []
        for slot in self.slots:
            if slot.deadline is not None and slot.stop_reason is None:
                moments.append(slot.deadline)
            if slot.kill_at is not None:
                moments.append(slot.kill_at)
        return min(moments, default=None)

    # ------------------------------------------------------------------ jobs in, events out

    def assign(self, slot: Slot, job: ClaimedJob) -> None:
        """Start ``job`` on ``slot``'s executor."""
        slot.job = job
        slot.started = time.monotonic()
        slot.deadline = slot.started + job.timeout if job.timeout else None
        slot.stop_reason = None
        slot.kill_at = None
        slot.watch = Watch(job.lease, Tail(self.log_bytes))
        lease = job.lease
        assignment = Assignment(
            job_id=lease.job_id,
            task=job.task,
            attempt=lease.attempt,
            max_attempts=job.max_attempts,
            worker_id=lease.worker_id,
            args_json=job.args_json,
            kwargs_json=job.kwargs_json,
            lease=lease.token,
            checkpoint=job.checkpoint,
            queue=job.queue,
            trace_context=job.trace_context,
        )
        # Pickled here in one call and written in one: the executor's ``recv()`` reads it as
        # if sent with ``send()``, which would build a pickler with its own dispatch table first.
        message = pickle.dumps(assignment, pickle.HIGHEST_PROTOCOL)
        # If the executor died between jobs, the send fails; its sentinel reports the crash.
        with contextlib.suppress(OSError):
            slot.conn.send_bytes(message)

    def defer(self, holder: Slot, job: ClaimedJob) -> None:
        """Start ``job`` in ``holder``'s place once its executor, which runs the same job under
        an older lease, has been stopped and has exited."""
        holder.deferred = job
        self.stop(holder, STOP_LEASE_LOST)

    def stop(self, slot: Slot, reason: str) -> None:
        """Stop ``slot``'s executor: SIGTERM now, SIGKILL after the kill grace."""
        slot.stop_reason = reason
        slot.kill_at = time.monotonic() + self.kill_grace
        slot.ready = False
        if slot.process.is_alive():
            slot.process.terminate()

    def wait(self, others: Sequence[Any], timeout: float) -> list[Any]:
        """Wait up to ``timeout`` seconds for an executor to say something or exit, or for one
        of ``others`` (sockets, file descriptors) to be ready; return what is ready."""
        waitables: list[Any] = list(others)
        for slot in self.slots:
            waitables.append(slot.conn)
            waitables.append(slot.process.sentinel)
            if slot.output is not None:
                waitables.append(slot.output)
        return self._wait(waitables, timeout)

    def events(self, ready: Sequence[Any]) -> Iterator[Event]:
        """What the executors that ``ready`` (from :meth:`wait`) holds have said and done. Each
        event is handled before the next one is read."""
        for slot in list(self.slots):
            if slot.output is not None and slot.output in ready:
                self._read_output(slot, OUTPUT_READ_LIMIT)
        for slot in list(self.slots):
            if slot.conn in ready:
                yield from self._receive(slot)
        for slot in list(self.slots):
            if slot.process.sentinel in ready and not slot.process.is_alive():
                elapsed = time.monotonic() - slot.started
                code = slot.process.exitcode
                watch = self._last_of(slot)
                yield Exited(slot, slot.job, slot.stop_reason, code, elapsed, watch)

    def _read_output(self, slot: Slot, limit: float) -> None:
        """Read what the executor wrote to its output pipe, up to ``limit`` bytes, into the
        running job's tail (outside a job, nothing is written there)."""
        assert slot.output is not None
        read = 0
        while read < limit:
            try:
                data = os.read(slot.output.fileno(), OUTPUT_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not data:
                return  # the executor has exited; its sentinel says so
            read += len(data)
            slot.output_read += len(data)
            if slot.watch is not None:
                slot.watch.printed(data)

    def _last_of(self, slot: Slot, written: int | None = None) -> Watch | None:
        """The running job's watch, with everything its executor wrote before it ended;
        ``written``: how many bytes it had written to its output pipe by then, if known (then
        only those not read yet are read, and most jobs, which print nothing, cost no read)."""
        if slot.output is not None:
            unread = float("inf") if written is None else written - slot.output_read
            if unread > 0:
                self._read_output(slot, unread)
        watch, slot.watch = slot.watch, None
        return watch

    def _receive(self, slot: Slot) -> Iterator[Reported]:
        try:
            messages = slot.conn.messages()
        except (EOFError, OSError):
            return  # the sentinel reports the death
        for message in messages:
            reported = self._received(slot, message)
            if reported is not None:
                yield reported

    def _received(self, slot: Slot, message: Any) -> Reported | None:
        job = slot.job
        if isinstance(message, Report) and job is not None and message.job_id == job.id:
            return self._reported(slot, job, message)
        if isinstance(message, Progress):
            if slot.watch is not None and job is not None and message.job_id == job.id:
                slot.watch.reported(message)
            return None
        if isinstance(message, CursorSaves):
            if slot.watch is not None and job is not None and message.job_id == job.id:
                slot.watch.saved(message.cursors)
            return None
        if message == "ready":
            slot.ready = True
            self.observer.executor_ready(slot.pid)
            return None
        logger.error("executor %d sent an unexpected message: %r", slot.index, message)
        return None

    def _reported(self, slot: Slot, job: ClaimedJob, message: Report) -> Reported:
        # Record what the job did even if it was being stopped at that moment: a finished job's
        # result beats a timeout. If the lease was lost meanwhile, the fenced write says so.
        elapsed = time.monotonic() - slot.started
        slot.job = None
        slot.deadline = None
        return Reported(slot, job, message, elapsed, self._last_of(slot, message.output_bytes))

    def replace(self, slot: Slot) -> Slot:
        """A fresh executor in the place of ``slot``'s, which has exited."""
        slot.conn.close()
        if slot.output is not None:
            slot.output.close()
        replacement = self._spawn(slot.index)
        self.slots[self.slots.index(slot)] = replacement
        return replacement

    def retire(self, slot: Slot) -> None:
        """Forget ``slot``, whose executor has exited, for good (the worker is stopping)."""
        slot.conn.close()
        if slot.output is not None:
            slot.output.close()
        self.slots.remove(slot)

    def enforce_deadlines(self, grace_deadline: float | None) -> None:
        """Stop the jobs that ran past their timeout, or past the end of the grace period of a
        shutdown; kill the executors that outlived their stop by the kill grace."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.job is None:
                continue
            if slot.deadline is not None and now >= slot.deadline and slot.stop_reason is None:
                logger.warning(
                    "job %d timed out after %ss: stopping it",
                    slot.job.id,
                    slot.job.timeout,
                    extra=job_fields(slot.job, slot.job.lease.worker_id),
                )
                self.stop(slot, STOP_TIMEOUT)
            if grace_deadline is not None and now >= grace_deadline and slot.stop_reason is None:
                logger.warning(
                    "job %d still running at the end of the grace period: releasing it",
                    slot.job.id,
                    extra=job_fields(slot.job, slot.job.lease.worker_id),
                )
                self.stop(slot, STOP_SHUTDOWN)
            if slot.kill_at is not None and now >= slot.kill_at and slot.process.is_alive():
                slot.process.kill()
                slot.kill_at = None

    def shutdown(self, *, force: bool) -> None:
        """Stop every executor: ask each to exit (or kill it, if ``force``), and wait a little."""
        self.observer.stopping([slot.pid for slot in self.slots])
        for slot in self.slots:
            if force:
                slot.process.kill()
            else:
                with contextlib.suppress(OSError):
                    slot.conn.send(None)
        deadline = time.monotonic() + 5
        for slot in self.slots:
            slot.process.join(max(0.0, deadline - time.monotonic()))
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(1)
            slot.conn.close()
            if slot.output is not None:
                slot.output.close()
