"""In-memory stand-ins for what a supervisor talks to: the queue, executor processes, the clock.

With them a :class:`~django_jobs.worker.supervisor.Supervisor` runs its real loop, outbox and
executor pool in the test's own process, on a clock that jumps instead of sleeping: no database,
no processes, milliseconds per test.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from django_jobs import workflows
from django_jobs.progress import Progress
from django_jobs.schedules.declarations import SyncReport
from django_jobs.schedules.ticks import FirePass
from django_jobs.store import (
    EXPIRED,
    HANDED_BACK,
    Beat,
    ClaimedJob,
    Ended,
    HandBack,
    Lease,
    LeaseStatus,
    Recorded,
    WorkerInfo,
)
from django_jobs.worker.executor import Assignment, Report
from django_jobs.worker.process_pool import ExecutorPool


class Clock:
    """``time.monotonic`` for the worker modules: it moves only when the loop waits."""

    #: How long a pass of the loop that waits for nothing takes.
    TICK = 0.05

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_to(self, moment: float) -> None:
        self.now = max(self.now, moment)


# ------------------------------------------------------------------ the queue


@dataclasses.dataclass
class FakeJob:
    id: int
    task: str
    max_attempts: int = 3
    timeout: int | None = None
    state: str = "pending"
    attempt: int = 0
    worker_id: str | None = None
    token: str | None = None
    cancel_requested: bool = False


@dataclasses.dataclass
class FakeSchedule:
    """A periodic job every ``every`` seconds of the fake clock, next due at ``due``."""

    name: str
    every: float
    due: float
    fired: list[float] = dataclasses.field(default_factory=list)


class FakeQueue:
    """The :class:`~django_jobs.worker.postgres_queue.Queue` protocol over a dict of jobs, and
    the :class:`~django_jobs.worker.duties.DatabaseDuties` of a worker with a database.

    ``failures[op, job_id]`` lists errors to raise, in turn, at the next calls of ``op`` (for
    ``job_id``, or ``None`` for a call about no job in particular); while the
    clock is before ``down_until`` every call fails as if the server were gone. A job handed
    back is reported expired if its task is in ``expired_tasks``; with ``run_elsewhere``, it is
    taken at once by a worker that has its task."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[int, FakeJob] = {}
        self.pending: dict[int, FakeJob] = {}  # in the order claims take them
        self.ids = itertools.count(1)
        self.tokens = itertools.count(1)
        self.outcomes: dict[str, str] = {}  # by lease token
        self.calls: list[tuple[float, str, int | None]] = []  # (time, op, job id)
        self.failures: dict[tuple[str, int | None], list[BaseException]] = collections.defaultdict(
            list
        )
        self.down_until = float("-inf")
        self.broken = False
        self.on_hand_back: Callable[[], None] | None = None
        self.expired_tasks: set[str] = set()
        self.run_elsewhere = False
        self.schedules: list[FakeSchedule] = []
        # What record_live wrote: (job id, progress, log).
        self.live: list[tuple[int, Progress | None, str | None]] = []
        self.cursors: list[tuple[int, dict[str, str]]] = []
        # The wait of each claim (long polling), in turn.
        self.waits: list[float] = []

    def add(self, task: str, count: int = 1, **fields: Any) -> list[FakeJob]:
        added = []
        for _ in range(count):
            job = FakeJob(next(self.ids), task, **fields)
            self.jobs[job.id] = job
            self.pending[job.id] = job
            added.append(job)
        return added

    def _set(self, job: FakeJob, state: str, attempt: int | None = None) -> None:
        job.state = state
        job.attempt = job.attempt if attempt is None else attempt
        if state == "pending":
            self.pending[job.id] = job
        else:
            self.pending.pop(job.id, None)
        if state != "running":
            job.worker_id = None

    def take_away(self, job_id: int) -> None:
        """What a reaper does to a job whose worker looked dead: it runs elsewhere now."""
        self.jobs[job_id].token = f"token-{next(self.tokens)}"
        self.jobs[job_id].worker_id = "elsewhere:1:abcdef"

    def _call(self, op: str, job_id: int | None = None) -> None:
        self.calls.append((self.clock.now, op, job_id))
        if self.clock.now < self.down_until:
            self.broken = True
            raise psycopg.OperationalError("connection refused: is the server running?")
        if self.failures[op, job_id]:
            raise self.failures[op, job_id].pop(0)
        self.broken = False

    def _holds(self, lease: Lease) -> FakeJob | None:
        job = self.jobs.get(lease.job_id)
        if job is None or job.state != "running" or job.token != lease.token:
            return None
        return job

    def _claim(self, worker_id: str, queues: Sequence[str], skip: Sequence[str]) -> Any:
        job = next((j for j in self.pending.values() if j.task not in skip), None)
        if job is None:
            return None
        self._set(job, "running", job.attempt + 1)
        job.worker_id, job.token = worker_id, f"token-{next(self.tokens)}"
        return ClaimedJob(
            lease=Lease(job.id, job.attempt, worker_id, job.token),
            attempt_id=job.id * 100 + job.attempt,
            task=job.task,
            queue="default",
            args_json="[]",
            kwargs_json="{}",
            max_attempts=job.max_attempts,
            timeout=job.timeout,
            parent_id=None,
        )

    def _finish(self, lease: Lease, outcome: str, options: dict[str, Any]) -> Ended | None:
        job = self._holds(lease)
        if job is None:
            return None
        if outcome in ("done", "cancelled"):
            self._set(job, outcome)
        elif options.get("retryable", True) and job.attempt < job.max_attempts:
            self._set(job, "pending")
        else:
            self._set(job, "error")
        self.outcomes[str(lease.token)] = outcome
        return Ended(job.id, job.state, None, False)

    # The protocol.

    label = "database"

    def trouble(self, exc: BaseException) -> str:
        return "database error"

    def claim(
        self, worker_id: str, queues: Sequence[str], skip_tasks: Sequence[str], *, wait: float = 0.0
    ) -> ClaimedJob | None:
        self._call("claim")
        self.waits.append(wait)
        return self._claim(worker_id, queues, skip_tasks)

    def finish(self, lease: Lease, outcome: str, **options: Any) -> Ended | None:
        self._call("finish", lease.job_id)
        return self._finish(lease, outcome, options)

    def finish_and_claim(
        self,
        lease: Lease,
        outcome: str,
        queues: Sequence[str],
        skip_tasks: Sequence[str],
        **options: Any,
    ) -> tuple[Ended | None, ClaimedJob | None]:
        self._call("finish", lease.job_id)
        ended = self._finish(lease, outcome, options)
        return ended, self._claim(lease.worker_id, queues, skip_tasks)

    def attempt_outcome(self, lease: Lease) -> str | None:
        self._call("attempt_outcome", lease.job_id)
        return self.outcomes.get(str(lease.token))

    def record_live(
        self,
        lease: Lease,
        progress: Progress | None,
        log: str | None,
        cursors: dict[str, str] | None = None,
    ) -> Recorded:
        self._call("record_live", lease.job_id)
        self.live.append((lease.job_id, progress, log))
        if cursors:
            self.cursors.append((lease.job_id, dict(cursors)))
        return Recorded(progress is not None or bool(cursors), log is not None)

    def release(self, lease: Lease, reason: str) -> bool:
        self._call("release", lease.job_id)
        job = self._holds(lease)
        if job is None:
            return False
        self._set(job, "pending", job.attempt - 1)
        return True

    def hand_back(
        self,
        lease: Lease,
        task: str,
        *,
        give_up_after: float,
        worker_timeout: float,
        seen_since: datetime.datetime | None,
    ) -> HandBack | None:
        self._call("hand_back", lease.job_id)
        if self.on_hand_back is not None:
            self.on_hand_back()
        job = self._holds(lease)
        if job is None:
            return None
        since = seen_since or datetime.datetime.now(datetime.UTC)
        if task in self.expired_tasks:
            return HandBack(EXPIRED, since)  # the job stays running, for the worker to end
        self._set(job, "done" if self.run_elsewhere else "pending", job.attempt - 1)
        return HandBack(HANDED_BACK, since)

    def settle(self, settling: workflows.Settling, until: float) -> None:
        self._call("settle")
        settling.todo.clear()

    def heartbeat(
        self, worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int]
    ) -> Beat:
        self._call("heartbeat")
        statuses = {}
        for lease in leases:
            job = self._holds(lease)
            held = job is not None and job.worker_id == lease.worker_id
            cancel = job is not None and job.cancel_requested
            statuses[str(lease.token)] = LeaseStatus(lease.job_id, held, cancel)
        known = {lease.job_id for lease in leases} | set(unwritten)
        orphans = [
            Lease(j.id, j.attempt, worker.id, j.token)
            for j in self.jobs.values()
            if j.state == "running" and j.worker_id == worker.id and j.id not in known
        ]
        return Beat(statuses, orphans)

    def recover_earlier_boots(self, worker: WorkerInfo) -> None:
        self._call("startup recovery")

    def sync_queue_limits(self) -> None:
        self._call("queue limits sync")

    def sync_alert_thresholds(self) -> None:
        self._call("alert thresholds sync")

    def unregister(self, worker_id: str) -> None:
        self._call("unregister")

    def roll_up(self, span: datetime.timedelta) -> None:
        """No hour to roll up."""
        self._call("rollups")

    def expire_due(self) -> list[int]:
        """No job past its deadline."""
        self._call("expiry")
        return []

    def sync_schedules(self) -> SyncReport:
        self._call("sync_schedules")
        return SyncReport()

    def fire_schedules(self, tasks: list[str]) -> FirePass:
        """Each due schedule fires once (missed ticks skipped), and is advanced."""
        self._call("fire_schedules")
        done, now = FirePass(), self.clock.now
        for schedule in self.schedules:
            if schedule.due <= now:
                schedule.fired.append(now)
                done.fired += 1
                done.handled += 1
                while schedule.due <= now:
                    schedule.due += schedule.every
        if self.schedules:
            done.seconds_until_due = min(s.due for s in self.schedules) - now
        return done

    def close(self) -> None:
        pass

    def ops(self, *names: str) -> list[tuple[str, int | None]]:
        """The calls made so far, of the operations ``names`` (all when none)."""
        return [(op, job_id) for _, op, job_id in self.calls if not names or op in names]


# ------------------------------------------------------------------ executors


#: What a fake executor does with a job: report at once (a Report), never report (None), or
#: die with an exit code (an int).
Behaviour = Callable[[Assignment], Report | list[Any] | int | None]


def succeed(assignment: Assignment) -> Report:
    return Report(assignment.job_id, "done", result_json="null")


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode: int | None = None
        self.terminated = False
        self.stubborn = False  # ignores SIGTERM

    @property
    def sentinel(self) -> FakeProcess:
        return self

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self.terminated = True
        if not self.stubborn:
            self.exit(-15)

    def kill(self) -> None:
        self.exit(-9)

    def exit(self, code: int) -> None:
        if self.exitcode is None:
            self.exitcode = code

    def join(self, timeout: float | None = None) -> None:
        self.exit(0)


class FakeConn:
    """The supervisor's end of an executor's pipe."""

    def __init__(self, process: FakeProcess, behaviour: Behaviour) -> None:
        self.process = process
        self.behaviour = behaviour
        self.inbox: collections.deque[Any] = collections.deque(["ready"])
        self.assignments: list[Assignment] = []
        self.closed = False

    def send(self, message: Any) -> None:
        if message is None:  # asked to exit
            self.process.exit(0)
            return
        self.assignments.append(message)
        result = self.behaviour(message)
        if isinstance(result, int):
            self.process.exit(result)
        elif isinstance(result, list):  # messages before the report: progress, say
            self.inbox.extend(result)
        elif result is not None:
            self.inbox.append(result)

    def send_bytes(self, data: bytes) -> None:
        self.send(pickle.loads(data))  # what the executor's recv() would make of it

    def recv(self) -> Any:
        if not self.inbox:
            raise EOFError
        return self.inbox.popleft()

    def messages(self) -> list[Any]:
        return [self.recv()]  # one at a time: each turn of the loop takes one

    def close(self) -> None:
        self.closed = True


class FakeExecutors:
    """Spawns fake executors into an :class:`ExecutorPool`, and waits on them on the fake clock:
    a wait returns what is ready, else moves the clock on by its timeout (a tick at least)."""

    def __init__(self, clock: Clock, behaviour: Behaviour = succeed) -> None:
        self.clock = clock
        self.behaviour = behaviour
        self.spawned: list[FakeConn] = []
        self.pids = itertools.count(10_000)

    def spawn(self, index: int) -> tuple[Any, Any, None]:
        conn = FakeConn(FakeProcess(next(self.pids)), self.behaviour)
        self.spawned.append(conn)
        return conn.process, conn, None

    def wait(self, waitables: list[Any], timeout: float) -> list[Any]:
        ready = [
            w
            for w in waitables
            if (isinstance(w, FakeConn) and w.inbox)
            or (isinstance(w, FakeProcess) and not w.is_alive())
        ]
        if not ready:
            self.clock.advance_to(self.clock.now + (timeout or Clock.TICK))
        return ready

    def pool(self, size: int) -> ExecutorPool:
        return ExecutorPool(size, kill_grace=5.0, spawn=self.spawn, wait=self.wait)

    @property
    def assignments(self) -> list[Assignment]:
        return [a for conn in self.spawned for a in conn.assignments]
