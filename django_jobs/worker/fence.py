"""The executors' fence: a job stops itself before the reaper could judge its worker gone.

The reaper may take a running job from a worker whose last heartbeat is older than
``JOBS_WORKER_TIMEOUT`` (docs/reaping.md), and another worker may then run it again. Fenced
writes keep the first run from recording anything after that, but its code would go on running:
a stalled supervisor (SIGSTOP, a frozen loop, a lost network) does not stop its executors, and
``concurrency_limit=1`` would let two bodies run at once. So every executor knows when its
supervisor's last heartbeat committed, through a shared double (:class:`Fence`, written by the
supervisor after each heartbeat that succeeded), and a watchdog thread in the executor
(:class:`Watchdog`) stops the job through the job's own timeout path, SIGTERM and then SIGKILL
after ``JOBS_KILL_GRACE``, once ``fence_after`` seconds have passed since that heartbeat was
sent:

    fence_after = JOBS_WORKER_TIMEOUT - JOBS_KILL_GRACE - FENCE_SLACK

so the job is dead ``FENCE_SLACK`` seconds before the reaper may call its worker gone (with a
``JOBS_WORKER_TIMEOUT`` of at least 4 x (``JOBS_KILL_GRACE`` + ``FENCE_SLACK``); a shorter one
moves the fence no earlier than :data:`FLOOR` of it, see :func:`fence_after`). The time
is counted from before the heartbeat was sent, which is before the database stamped it, so the
reaper's count by the database's clock starts later than the executor's.

The clock is ``CLOCK_BOOTTIME`` where there is one (Linux), else ``time.monotonic()``; both are
system-wide, so the supervisor's and the executors' readings compare. ``CLOCK_BOOTTIME`` goes on
counting while the host is suspended, as the database's clock does; see docs/reaping.md for
what holds when the whole host, or the whole process group, is paused.

The parent-death signal (:func:`die_with_parent`) is the other half: an executor dies with its
supervisor, whatever killed it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

#: Seconds between the moment a fenced job is dead (its SIGKILL) and the earliest moment the
#: reaper may judge its worker gone: room for the executor's reaction (:data:`WATCH_EVERY`), the
#: kernel delivering the kill, and the clocks of two hosts ticking at slightly different rates.
FENCE_SLACK = 2.0

#: How often, at most, a watchdog looks at the time while its job runs, in seconds. It also
#: bounds how long a job runs on after the host resumes from a pause that took it past its
#: fence (docs/reaping.md).
WATCH_EVERY = 0.1

#: The value of the executor's ``stop_requested`` byte once it has fenced itself (the supervisor
#: sets 1 when it stops the executor itself).
FENCED = 2


def clock() -> float:
    """Seconds on a system-wide clock that does not go back, and counts a suspended host's
    sleep where the system can (``CLOCK_BOOTTIME``)."""
    return time.clock_gettime(CLOCK) if CLOCK is not None else time.monotonic()


CLOCK: int | None = getattr(time, "CLOCK_BOOTTIME", None)


#: The earliest an executor stops its job, as a share of ``JOBS_WORKER_TIMEOUT``: a timeout too
#: short for the margin (under 4 x (``JOBS_KILL_GRACE`` + :data:`FENCE_SLACK`)) would otherwise
#: stop jobs at the first late heartbeat, or at once.
FLOOR = 0.75


def fence_after(worker_timeout: float, kill_grace: float) -> float:
    """Seconds after its worker's last heartbeat was sent at which an executor stops its job:
    ``JOBS_KILL_GRACE`` plus :data:`FENCE_SLACK` before ``JOBS_WORKER_TIMEOUT``, but never
    before :data:`FLOOR` of it (then the kill may come after the reaper could act)."""
    return max(worker_timeout - kill_grace - FENCE_SLACK, FLOOR * worker_timeout)


class Fence:
    """The supervisor's side: the moment (:func:`clock`) its last heartbeat that committed was
    sent, in a double of shared memory that every executor reads, and the terms of the fence."""

    def __init__(self, worker_timeout: float, kill_grace: float) -> None:
        self.after = fence_after(worker_timeout, kill_grace)
        self.worker_timeout = worker_timeout
        self.kill_grace = kill_grace
        # One writer (the supervisor), readers that need only a recent value: no lock. A double
        # is written in one store on every platform this runs on.
        self.last_beat = multiprocessing.get_context("spawn").RawValue("d", float("-inf"))

    def committed(self, sent: float) -> None:
        """A heartbeat sent at ``sent`` (:func:`clock`) has committed."""
        self.last_beat.value = sent

    def terms(self) -> tuple[Any, float, float]:
        """What an executor is given of the fence: the shared moment, and the two delays."""
        return (self.last_beat, self.after, self.kill_grace)


class Watchdog:
    """The executor's side: a daemon thread that, while a job runs, stops it once its
    supervisor's last heartbeat is ``after`` seconds old: ``stop_requested`` set to
    :data:`FENCED`, SIGTERM to the job's thread (the executor's SIGTERM handler dies of it,
    unless the job installed its own), then SIGKILL ``kill_grace`` seconds later. Behind it, a
    kernel timer (:class:`KernelKill`), moved on at each look, SIGKILLs the process at that same
    last moment if the thread could not run: a job holding the GIL for that long while its
    supervisor is healthy is killed too (and recorded crashed)."""

    def __init__(self, terms: tuple[Any, float, float], stop_requested: Any) -> None:
        self.last_beat, self.after, self.kill_grace = terms
        self.stop_requested = stop_requested
        self.job: int | None = None
        self.kernel = KernelKill()
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="django-jobs-fence", daemon=True)
        self.thread.start()

    def running(self, job_id: int | None) -> None:
        """``job_id`` has started (``None``: the job has ended)."""
        with self.changed:
            self.job = job_id
            # Armed from here, before the job runs: a job that takes the GIL at once would
            # keep this thread from ever arming it.
            known = job_id is not None and self.last_beat.value > float("-inf")
            self.kernel.at(self.last_beat.value + self.after + self.kill_grace if known else None)
            self.changed.notify()

    def _loop(self) -> None:
        with self.changed:
            while True:
                if self.job is None or self.last_beat.value == float("-inf"):
                    # No job, or no heartbeat has committed yet (the supervisor claims nothing
                    # before one has): nothing to count from.
                    self.changed.wait(None if self.job is None else WATCH_EVERY)
                    continue
                fence = self.last_beat.value + self.after
                # Should this thread not get to run (the job holds the GIL), the kernel kills
                # the job when it must be dead; each look moves that moment on.
                self.kernel.at(fence + self.kill_grace)
                left = fence - clock()
                if left > 0:
                    self.changed.wait(min(left, WATCH_EVERY))
                    continue
                job, age = self.job, clock() - self.last_beat.value
                break
        self._stop(job, age)

    def _stop(self, job: int, age: float) -> None:
        self.stop_requested.value = FENCED
        print(
            f"django-jobs: stopping job {job}: no heartbeat of this worker has committed for"
            f" {age:.1f}s, and the reaper may soon give the job to another worker",
            file=sys.__stderr__,
            flush=True,
        )
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        time.sleep(self.kill_grace)
        os.kill(os.getpid(), signal.SIGKILL)


class _Sigevent(ctypes.Structure):
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("_rest", ctypes.c_byte * 48),  # struct sigevent is 64 bytes
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class KernelKill:
    """A POSIX timer on :data:`CLOCK` that has the kernel SIGKILL this process at a given
    moment: it needs no Python code to run, so it stops a job that holds the GIL (C code that
    never releases it), which the watchdog thread could not. Linux only; elsewhere (or if the
    timer cannot be made) :meth:`at` does nothing."""

    def __init__(self) -> None:
        self.timer: ctypes.c_void_p | None = None
        if not sys.platform.startswith("linux") or CLOCK is None:
            return
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        event = _Sigevent(sigev_signo=signal.SIGKILL, sigev_notify=0)  # SIGEV_SIGNAL
        timer = ctypes.c_void_p()
        if self.libc.timer_create(CLOCK, ctypes.byref(event), ctypes.byref(timer)) == 0:
            self.timer = timer

    def at(self, moment: float | None) -> None:
        """SIGKILL this process at ``moment`` (:func:`clock`); ``None``: never."""
        if self.timer is None:
            return
        spec = _Itimerspec()
        if moment is not None:
            moment = max(moment, 1e-9)  # zero would disarm
            spec.it_value.tv_sec = int(moment)
            spec.it_value.tv_nsec = int((moment - int(moment)) * 1e9)
        abstime = 1  # TIMER_ABSTIME
        self.libc.timer_settime(self.timer, abstime, ctypes.byref(spec), None)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent, the supervisor, dies, whatever
    killed it (Linux's ``PR_SET_PDEATHSIG``; elsewhere, the end of its pipe is all there is).
    If the parent is already gone (it died before this ran), exit now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
