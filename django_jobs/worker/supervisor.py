"""The supervisor: the one process of a worker that talks to the queue.

It owns a single PostgreSQL connection (autocommit, so every statement is its own short
transaction) for claims, finishes, releases and heartbeats, and hands claimed jobs to a pool of
executor processes over pipes. No transaction is open and no lock is held while a job runs.

One loop: wait on the executors' pipes and process sentinels, a signal wake-up socket and a
timer; then react. Its one helper thread makes a job's finish (and the next claim) while the
loop serves the other executors, one round trip at a time (round_trip.py). Writes that fail
because the database is away are kept in an outbox and retried with backoff, so a finished
job's result survives a database restart.

Every claim and finish commits durably, and every write of a run is fenced on its lease token.
What a server crash or a lost reply can still leave behind, the heartbeat finds (see
:func:`django_jobs.reaper.recover_orphans`): a claim whose reply never arrived is released
without counting the attempt, and a finish that the database lost again is written again from
memory.

This module is the loop; each of its steps has a module of its own in this package (the queue
and the database duties, the heartbeats, the runs on the executor pool, the writes and their
outbox, outcomes, deploys, signals, the observer) or beside it (the scheduler, backoff).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import time
from collections.abc import Sequence
from typing import Any

from django_jobs import conf
from django_jobs.exceptions import InvalidOption
from django_jobs.registry import registry
from django_jobs.runtime.identity import base_name, new_worker_id
from django_jobs.schedules.runner import Scheduler
from django_jobs.store import ClaimedJob
from django_jobs.store.connection import QueueConnection
from django_jobs.worker.deploys import UnknownTasks
from django_jobs.worker.duties import DatabaseDuties, PostgresDuties, start_up
from django_jobs.worker.expiry_pass import ExpiryPass
from django_jobs.worker.heartbeats import Heartbeats, this_worker
from django_jobs.worker.live import LiveWrites
from django_jobs.worker.observer import Observer
from django_jobs.worker.outbox import Outbox
from django_jobs.worker.outcomes import OutcomeLog
from django_jobs.worker.postgres_queue import FAILED, PostgresQueue, Queue, QueueGate
from django_jobs.worker.process_pool import ExecutorPool
from django_jobs.worker.rollup_pass import RollupPass
from django_jobs.worker.round_trip import RoundTrip
from django_jobs.worker.runs import Runs
from django_jobs.worker.signals import WakeSocket
from django_jobs.worker.slots import Reported, Slot
from django_jobs.worker.wakeup import FOLLOWER_POLL_FACTOR, Wakeup
from django_jobs.worker.writes import JobWrites

logger = logging.getLogger("django_jobs.worker")


class Supervisor:
    """Run jobs from ``queues`` (all queues when empty) with ``concurrency`` executors.

    ``db`` (the queue) and ``pool`` (the executors) are built from the settings unless given:
    the unit tests give fakes, and ``runjobworker --api`` an
    :class:`~django_jobs.worker.http_queue.HttpQueue`. ``duties``: what the worker does besides
    when it has a database (recovery, queue limits, settling, schedules); built with the queue
    when ``db`` is not given, and none of them are done without it. ``observer`` is told of
    moments of the worker's life. ``long_poll``: at most how long an idle worker's claim may wait
    for a job (a queue that can wait; 0: claims answer at once, and the worker polls or
    LISTENs).
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        name: str | None = None,
        burst: bool = False,
        burst_wait: float = 0.0,
        alive_file: str | None = None,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        grace: float = 25.0,
        install_signals: bool = True,
        listen: bool | None = None,
        db: Queue | None = None,
        duties: DatabaseDuties | None = None,
        pool: ExecutorPool | None = None,
        observer: Observer | None = None,
        scheduler: bool = True,
        long_poll: float = 0.0,
    ) -> None:
        if concurrency < 1:
            raise InvalidOption("concurrency must be at least 1")
        self.queues = list(queues or [])
        self.concurrency = concurrency
        self.name = base_name(name)
        self.worker_id = new_worker_id(self.name)
        self.burst = burst
        # With burst: also wait for jobs that become ready within this many seconds.
        self.burst_wait = burst_wait
        self.burst_checked_poll: float | None = None
        self.burst_waiting = False
        # Touched on every turn of the loop, for a container's liveness probe.
        self.alive_file = alive_file
        self.alive_touched_at = -1.0
        self.max_jobs = max_jobs
        self.poll_interval = conf.poll_interval() if poll_interval is None else poll_interval
        self.grace = grace
        self.long_poll = long_poll
        self.install_signals = install_signals
        self.observer = observer or Observer()
        alias = conf.database_alias()
        round_trip = None
        if db is None:
            connection = QueueConnection(alias, self.worker_id, on_connect=self.observer.connected)
            db, duties = PostgresQueue(connection), PostgresDuties(connection)
            # Finishes are sent while the loop serves the other executors (round_trip.py). With
            # one slot there is nothing to serve meanwhile: the next job comes with the finish,
            # and handing the call to a thread would only cost CPU.
            if concurrency > 1:
                round_trip = RoundTrip()
        self.db: Queue = db
        self.duties = duties
        self.pool = pool or ExecutorPool(concurrency, observer=self.observer)
        self.wakeup = (
            Wakeup(alias, self.worker_id, self.queues)
            if (conf.listen() if listen is None else listen)
            else None
        )
        self.info = this_worker(self.worker_id, self.name, self.queues, concurrency)
        self.log = OutcomeLog(self.worker_id)
        self.stats = self.log.stats
        self.gate = QueueGate(self.db, round_trip)
        self.scheduler = Scheduler(duties, self.gate, enabled=scheduler)
        self.rollups = RollupPass(duties, self.gate)
        self.expiry = ExpiryPass(duties, self.gate)
        self.outbox = Outbox(self.gate)
        self.live = LiveWrites(
            self.db, self.outbox, conf.progress_interval(), cursor_interval=conf.cursor_interval()
        )
        self.unknown_tasks = UnknownTasks(self.worker_id)
        worker_timeout = conf.worker_timeout()
        self.writes = JobWrites(
            self.db,
            self.outbox,
            self.log,
            self.unknown_tasks,
            self,
            duties=duties,
            worker_timeout=worker_timeout,
        )
        self.heartbeats = Heartbeats(
            self.info,
            self.db,
            self.gate,
            self.pool,
            self.outbox,
            self.writes,
            self.log,
            interval=conf.heartbeat_interval(),
            worker_timeout=worker_timeout,
        )
        self.runs = Runs(self.pool, self.writes, self.live, self.log, self.observer)
        self.stopping = False
        self.hard_stop = False
        self.grace_deadline: float | None = None
        self.queue_may_have_work = True
        self.next_poll = 0.0
        self.recovered = False
        self.wake = WakeSocket()

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Serve jobs until stopped; return the process exit code."""
        previous_handlers = self.wake.install(self._on_signal) if self.install_signals else None
        logger.info(
            "worker %s starting: queues=%s concurrency=%d%s",
            self.worker_id,
            ",".join(self.queues) or "*",
            self.concurrency,
            " burst" if self.burst else "",
            extra={"worker_id": self.worker_id},
        )
        try:
            self.pool.start()
            self.heartbeats.beat()
            while not self._finished():
                self._step()
            return 1 if self.hard_stop else 0
        finally:
            if not self.hard_stop:
                # A finish in flight ends first; a job it claimed is released (we are stopping).
                self.stopping = True
                self.gate.close()
                self.outbox.flush()
            self.pool.shutdown(force=self.hard_stop)
            if not self.hard_stop:
                self.gate.call("unregister", lambda: self.db.unregister(self.worker_id))
            if not self.gate.busy:  # else exiting now: the process's end closes it
                self.db.close()
            if self.wakeup is not None:
                self.wakeup.close()
            if previous_handlers:
                self.wake.restore(previous_handlers)
            self.log.stopped()

    def request_stop(self) -> None:
        """Stop claiming; let running jobs finish within the grace period. Thread-safe."""
        if not self.stopping:
            self.stopping = True
            self.grace_deadline = time.monotonic() + self.grace
        self.wake.wake()

    def _finished(self) -> bool:
        if self.hard_stop:
            return True
        if self.pool.busy() or (self.outbox and not self._outbox_hopeless()):
            return False
        if self.stopping:
            return True
        if self.max_jobs is not None and self.stats.claimed >= self.max_jobs:
            return True
        return self.burst and not self.queue_may_have_work and not self._ready_soon()

    def _ready_soon(self) -> bool:
        """With ``--burst-wait``: whether a job (a retry waiting out its backoff, a delayed
        job) becomes ready within the limit. Asked once per poll; the next poll is brought
        forward to the moment it is ready."""
        if self.burst_wait <= 0 or self.duties is None:
            return False
        if self.burst_checked_poll == self.next_poll:
            return self.burst_waiting
        duties = self.duties
        skip = [*self.unknown_tasks.skip(), *registry.remote_names()]
        due = self.gate.call(
            "burst wait",
            functools.partial(duties.next_ready_within, self.queues, skip, self.burst_wait),
        )
        if due is FAILED:
            return True  # the gate waits for the database; nothing is known yet
        self.burst_waiting = due is not None
        if due is not None:
            self.next_poll = min(self.next_poll, time.monotonic() + due)
        self.burst_checked_poll = self.next_poll
        return self.burst_waiting

    def _outbox_hopeless(self) -> bool:
        # While stopping, don't wait forever for a database that is gone: the reaper will
        # recover whatever these writes would have recorded.
        return (
            self.stopping
            and self.grace_deadline is not None
            and (time.monotonic() > self.grace_deadline + 30)
        )

    # ------------------------------------------------------------------ the loop

    def _step(self) -> None:
        now = time.monotonic()
        if self.alive_file is not None and now - self.alive_touched_at >= 1.0:
            self._touch_alive(now)
        self.outbox.flush()
        if now >= self.heartbeats.next_at:
            self.heartbeats.beat()
        if self.duties is not None and not self.recovered and not self.gate.waiting():
            self.recovered = start_up(self.duties, self.gate, self.info)
        self.scheduler.step(self.stopping)
        self.rollups.step(self.stopping)
        self.expiry.step(self.stopping)
        if now >= self.next_poll:
            self.queue_may_have_work = True
        if self.wakeup is not None:
            self.wakeup.ensure()
        self._fill_slots()
        if self.wakeup is not None:
            # Get in line to be the one that wakes for this queue set, or leave that place to
            # the next in line when no slot is free (wakeup.py).
            self.wakeup.step(free=self._can_claim() and self.pool.free_slot() is not None)
        if self._finished():
            return  # e.g. --burst found nothing: exit now, not after one more poll interval
        self._wait(self._next_timeout())
        self.live.step(self.pool.watches())
        self.pool.enforce_deadlines(self.grace_deadline)

    def _touch_alive(self, now: float) -> None:
        """Show a liveness probe that this loop turns: database outages included, since the
        worker rides those out itself; a frozen loop stops touching the file."""
        self.alive_touched_at = now
        path = self.alive_file
        if path is None:
            return
        try:
            with open(path, "a"):
                os.utime(path)
        except OSError as error:
            logger.warning("cannot touch --alive-file %s: %s", self.alive_file, error)
            self.alive_file = None

    def _can_claim(self) -> bool:
        if self.stopping or self.hard_stop:
            return False
        if self.max_jobs is not None and self.stats.claimed >= self.max_jobs:
            return False
        return not self.gate.waiting() and self.heartbeats.alive()

    def slot_for_next_job(self) -> Slot | None:
        """The slot a claim made now would fill; ``None`` if no claim is due (see writes.py)."""
        return self.pool.free_slot() if self.queue_may_have_work and self._can_claim() else None

    def _fill_slots(self) -> None:
        # A finish owed goes first (one a heartbeat waited for may have just freed the
        # connection): it claims for a free slot in the same round trip.
        if self.outbox:
            self.outbox.flush()
        while self.queue_may_have_work and self._can_claim():
            slot = self.pool.free_slot()
            if slot is None:
                return
            if self.gate.busy:
                # The finish in flight claims for a slot that still looks free, and each finish
                # owed will claim for another: wait for the round trip (not to claim for one of
                # those slots) only if more slots are free than that (at start, say).
                if self.pool.free_slots() <= self.outbox.finishes():
                    return
                self.gate.settle()
                continue
            # Tasks declared for workers of the HTTP API are never claimed here.
            skip = [*self.unknown_tasks.skip(), *registry.remote_names()]
            wait = self._claim_wait()
            job = self.gate.call(
                "claim",
                functools.partial(self.db.claim, self.worker_id, self.queues, skip, wait=wait),
            )
            if job is FAILED:
                return
            if job is None and wait > 0:
                # The wait was the poll: look again as soon as the loop has gone round.
                self.queue_may_have_work = False
                self.next_poll = time.monotonic()
                return
            if job is not None and self.stopping:
                # A signal came during the long poll: this job goes back without running.
                self.writes.release(job.lease, self.log.fields(job), "released: worker stopping")
                return
            if not self.claimed(slot, job):
                # Back to the loop between two hand-backs, so that however many there are,
                # heartbeats and executors are served in between; the next claim comes at once.
                return

    def _claim_wait(self) -> float:
        """How long the next claim may wait for a job: only while nothing runs, nothing is owed
        to the queue and nothing is LISTENed to (the loop serves none of them while a claim
        waits), and never past the next moment the loop has something to do."""
        if (
            self.long_poll <= 0
            or self.burst
            or self.wakeup is not None
            or self.pool.busy()
            or self.outbox
        ):
            return 0.0
        moments = [
            self.heartbeats.next_at,
            self.scheduler.due_at,
            self.rollups.due_at,
            self.expiry.due_at,
        ]
        if self.grace_deadline is not None:
            moments.append(self.grace_deadline)
        return max(0.0, min(self.long_poll, min(moments) - time.monotonic()))

    def claimed(self, slot: Slot, job: ClaimedJob | None) -> bool:
        """Start a claimed job in ``slot``; or, if the queue had none, wait for the next poll.
        False if the job was handed back instead (its task is not registered here)."""
        if job is None:
            self.queue_may_have_work = False
            self.next_poll = time.monotonic() + self._poll_interval_now()
            return True
        if self.stopping or slot.busy or not any(s is slot for s in self.pool.slots):
            # Claimed with a finish that was in flight when the worker began to stop (or the
            # slot's executor was replaced meanwhile): the job goes back without running.
            self.writes.release(job.lease, self.log.fields(job), "released: worker stopping")
            return False
        if not registry.runs_here(job.task):
            # Never hand an executor a name it would have to import. A worker that has the task
            # may exist (a rolling deploy): hand the job back without counting the attempt.
            self.writes.hand_back(job)
            return False
        self.stats.claimed += 1
        self.runs.start(slot, job)
        return True

    def _poll_interval_now(self) -> float:
        """The wait until the next poll, jittered: longer while another worker listens for
        this one's queues, which polls every poll interval itself (wakeup.py)."""
        following = self.wakeup is not None and self.wakeup.following
        return (
            self.poll_interval
            * (FOLLOWER_POLL_FACTOR if following else 1)
            * random.uniform(0.8, 1.2)
        )

    def _next_timeout(self) -> float:
        now = time.monotonic()
        moments = [
            self.heartbeats.next_at,
            self.scheduler.due_at,
            self.rollups.due_at,
            self.expiry.due_at,
        ]
        # While claims are held back (a database backoff, no recent heartbeat, stopping), a
        # poll is no reason to wake: what ends the hold is a moment below, or an event.
        if self._can_claim():
            if not self.queue_may_have_work:
                moments.append(self.next_poll)
            elif self.pool.free_slot() is not None and not self.gate.busy:
                moments.append(now)
        # While a write is in flight, the others wait for it: its end wakes the loop.
        write_due = None if self.gate.busy else self.outbox.next_due()
        if write_due is not None:
            moments.append(max(self.gate.retry_at, write_due))
        elif now < self.gate.retry_at:
            moments.append(self.gate.retry_at)
        for moment in (
            self.pool.next_deadline(),
            self.grace_deadline,
            self.live.due_at(self.pool.watches()),
        ):
            if moment is not None:
                moments.append(moment)
        return max(0.0, min(moments) - now)

    def _wait(self, timeout: float) -> None:
        listen_fd = self.wakeup.fileno() if self.wakeup is not None else None
        wake = self.wake.reader
        others: list[Any] = [wake] if listen_fd is None else [wake, listen_fd]
        round_trip_fd = self.gate.fileno()
        if round_trip_fd is not None and self.gate.busy:
            others.append(round_trip_fd)
        ready = self.pool.wait(others, timeout)
        self.gate.collect()  # the finish in flight, if it is back: start the job it claimed
        if self.wakeup is not None and listen_fd in ready:
            if self.wakeup.drain():
                self.queue_may_have_work = True
            if self.wakeup.listening:
                # A worker that has just become the listener polls every poll interval.
                self.next_poll = min(self.next_poll, time.monotonic() + self._poll_interval_now())
        if wake in ready:
            self.wake.drain()
        for event in self.pool.events(ready):
            if isinstance(event, Reported):
                # The job may have made work ready (children it spawned, dependents its end
                # promotes): look again (with the finish, in the same round trip) rather than
                # wait for a poll.
                self.queue_may_have_work = True
                self.runs.reported(event)
            else:
                self.runs.exited(event, stopping=self.stopping or self.hard_stop)

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            logger.warning("%s again: exiting now; the reaper will recover running jobs", name)
            self.hard_stop = True
        else:
            logger.info(
                "%s: no new jobs; waiting up to %.0fs for %d running job(s)",
                name,
                self.grace,
                self.pool.busy(),
            )
            self.request_stop()
