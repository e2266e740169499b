"""Executor processes: each runs one job function at a time, and nothing else.

An executor never touches the queue tables. It receives a job over a pipe from the supervisor,
runs it with no transaction open, and sends back what happened: on the same pipe, the progress
the job reports as it goes, and on a second one, what it prints and logs (worker/capture.py). A
job's own ORM queries use the executor's own Django connections. Because a job runs in its own
process, the supervisor can stop it for real (timeout, cancellation) and survives it crashing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from django_jobs.exceptions import Cancelled, Fail, InvalidStepResult, Retry, UnknownTask
from django_jobs.runtime import tracing
from django_jobs.worker.capture import Sink, captured
from django_jobs.worker.fence import Watchdog, die_with_parent

if TYPE_CHECKING:
    from django_jobs.progress import Progress
    from django_jobs.store import Checkpoint
    from django_jobs.tasks import Task


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A job handed to an executor."""

    job_id: int
    task: str
    attempt: int
    max_attempts: int
    worker_id: str
    args_json: str
    kwargs_json: str
    lease: str | None = None
    #: The job's recorded steps and cursors, where the claim brought them (the HTTP API); None:
    #: the run reads them from the job database if it asks for a step or a cursor.
    checkpoint: Checkpoint | None = None
    queue: str = ""
    #: The W3C trace context the job was enqueued in, which the run's span links to (None: none).
    trace_context: dict[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class CursorSaves:
    """Cursors a job saved (name -> the value's JSON text), sent to the supervisor, which writes
    the newest with the run's progress (worker/live.py)."""

    job_id: int
    cursors: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Report:
    """What an executor says about the job it ran."""

    job_id: int
    outcome: str  # "done", "error" or "cancelled"
    result_json: str | None = None
    error: str = ""
    traceback: str = ""
    retryable: bool = True
    retry_after: float | None = None
    #: How many bytes the executor had written to its output pipe, since it started, when it
    #: sent this report (``None``: not counted). The supervisor reads that pipe for the rest
    #: of the job's output only if it has not read that many yet: most jobs print nothing.
    output_bytes: int | None = None


class Pipe:
    """The executor's end of its pipe to the supervisor, shared by the job's threads (progress)
    and the executor's loop (reports)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, message: Any) -> None:
        # Connection.send's framing is what the supervisor reads (worker/spawn.py, ExecutorEnd).
        with self.lock:
            self.conn.send(message)


#: How often, at most, an executor sends its job's progress to the supervisor, in seconds.
#: Pickling a report and writing it to the pipe takes tens to hundreds of microseconds, which a
#: job calling ``context.progress()`` per item would pay on every item; the supervisor writes
#: progress to the database only once per ``JOBS_PROGRESS_INTERVAL`` (seconds) anyway, so
#: sending the latest value every 20 ms hides nothing anyone can see.
SEND_PROGRESS_EVERY = 0.02


class ProgressOut:
    """Where a job's ``context.progress()`` reports go in an executor: a call only keeps the
    latest value (and wakes the sender); a daemon thread sends it down the pipe, at most once
    per ``every`` seconds, so a value is never held back longer than that, even when no other
    call follows. :meth:`flush` sends what is pending at once, from the caller's thread: the
    executor calls it when a job ends, before its report, so that the supervisor always has
    the last value before the finish. Sending takes :attr:`lock`, and the pipe its own lock,
    so two threads never write to the pipe at once and a flushed value is never followed by
    an older one."""

    def __init__(self, pipe: Pipe, every: float = SEND_PROGRESS_EVERY) -> None:
        self.pipe = pipe
        self.every = every
        self.pending: Progress | None = None
        #: Cursors saved since the last send, of the job of ``cursors_of``.
        self.cursors: dict[str, str] = {}
        self.cursors_of = 0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.next_send = 0.0
        self.thread: threading.Thread | None = None

    def __call__(self, value: Progress) -> None:
        self.pending = value
        if not self.wake.is_set():
            if self.thread is None:
                self._start()
            self.wake.set()

    def cursor(self, job_id: int, name: str, value_json: str) -> None:
        """Keep a cursor save of ``job_id`` to send (the newest per name), as :meth:`__call__`
        keeps progress."""
        with self.lock:
            if self.cursors_of != job_id:
                self.cursors, self.cursors_of = {}, job_id
            self.cursors[name] = value_json
        if not self.wake.is_set():
            if self.thread is None:
                self._start()
            self.wake.set()

    def flush(self) -> None:
        """Send the pending values now, if there are any."""
        from django_jobs.sanitize import mask_text

        with self.lock:
            value, self.pending = self.pending, None
            if self.cursors:
                saves = CursorSaves(self.cursors_of, self.cursors)
                self.cursors = {}
                self.next_send = time.monotonic() + self.every
                with contextlib.suppress(OSError):
                    self.pipe.send(saves)
            if value is None:
                return
            if value.message:
                # Masked here, in the executor, once per value sent: not per call (progress
                # must stay cheap), and not by the supervisor.
                value = dataclasses.replace(value, message=mask_text(value.message))
            self.next_send = time.monotonic() + self.every
            with contextlib.suppress(OSError):  # the supervisor is gone; so is the report
                self.pipe.send(value)

    def _start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name="django-jobs-progress", daemon=True
                )
                self.thread.start()

    def _loop(self) -> None:
        while True:
            self.wake.wait()
            # Cleared before the value is taken: a report made after that sets it again.
            self.wake.clear()
            delay = self.next_send - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.flush()


def run_assignment(
    assignment: Assignment,
    report_progress: Callable[[Progress], None] | None = None,
    output: Sink | None = None,
    report_cursor: Callable[[str, str], None] | None = None,
) -> Report:
    """Run one job function and describe the result, in text PostgreSQL can store (see
    storable.py: a NUL or invalid Unicode in an error message must not make the outcome
    impossible to record). Never raises. The job's progress goes to ``report_progress``, and
    a copy of what it prints and logs to ``output``."""
    from django_jobs import conf
    from django_jobs.storable import storable_text

    prefix = f"[job {assignment.job_id}] "
    span = tracing.run_span(
        assignment.job_id,
        assignment.task,
        assignment.queue,
        assignment.attempt,
        assignment.trace_context,
    )
    with (
        captured(output, conf.capture_log_level(), conf.attempt_log_bytes(), prefix),
        span as run,
    ):
        _RUNNING[0] = run
        try:
            report = _run(assignment, report_progress, report_cursor, run)
        finally:
            _RUNNING[0] = None
        tracing.ended(run, report.outcome, report.error)
        sys.stdout.flush()
        sys.stderr.flush()
    return dataclasses.replace(
        report,
        error=storable_text(report.error),
        traceback=storable_text(report.traceback),
        output_bytes=None if output is None else output.written,
    )


#: The span of the run in progress (None: none, or no tracing), which a SIGTERM of the
#: supervisor ends before the executor dies of it.
_RUNNING: list[Any] = [None]


def _run(
    assignment: Assignment,
    report_progress: Callable[[Progress], None] | None,
    report_cursor: Callable[[str, str], None] | None = None,
    span: Any = None,
) -> Report:
    from django.db import close_old_connections

    from django_jobs.context import JobContext
    from django_jobs.registry import registry

    job_id = assignment.job_id
    try:
        task = registry.get(assignment.task)
    except UnknownTask as exc:
        return Report(job_id, "error", error=str(exc), retryable=True)
    try:
        args = json.loads(assignment.args_json)
        kwargs = json.loads(assignment.kwargs_json)
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise TypeError("args must be a JSON array and kwargs a JSON object")
    except (ValueError, TypeError) as exc:
        return Report(job_id, "error", error=f"bad job arguments: {exc}", retryable=False)

    close_old_connections()
    context = JobContext(
        job_id=job_id,
        task=assignment.task,
        attempt=assignment.attempt,
        max_attempts=assignment.max_attempts,
        worker_id=assignment.worker_id,
        lease=assignment.lease,
        report_progress=report_progress,
        report_cursor=report_cursor,
        checkpoint=assignment.checkpoint,
    )
    try:
        if task.runner is not None:
            # A @task of Django's Tasks framework: its backend wraps the call (TaskContext,
            # the framework's signals); the function itself still runs through _call.
            value = task.runner(context, functools.partial(_call, task), args, kwargs)
        else:
            if task.takes_context:
                args = [context, *args]
            value = _call(task, args, kwargs)
    except BaseException as exc:  # a job's SystemExit or KeyboardInterrupt must not kill us
        report = _report_of(job_id, exc)
        tracing.failed(span, exc, report.traceback)
        return report
    finally:
        close_old_connections()
    from django_jobs.storable import NOTE, storable_json

    try:
        result_json, changed = storable_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        # Running it again would return the same: the attempt fails for good.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        return Report(
            job_id,
            "error",
            retryable=False,
            error=f"the job returned {type(value).__name__}, which is not JSON: {reason}",
        )
    # The job succeeded: its result is kept, and the job's error field says what was changed.
    error = f"the result held text PostgreSQL cannot store: {NOTE}" if changed else ""
    return Report(job_id, "done", result_json=result_json, error=error)


def _report_of(job_id: int, exc: BaseException) -> Report:
    """The report of a run whose job raised ``exc``."""
    from django_jobs.sanitize import format_exception

    if isinstance(exc, Retry):
        return Report(
            job_id,
            "error",
            error=f"Retry: {exc.reason or 'retry requested'}",
            traceback=format_exception(exc),
            retryable=True,
            retry_after=exc.after,
        )
    if isinstance(exc, Cancelled):
        return Report(
            job_id,
            "cancelled",
            error=f"Cancelled: {exc.reason or 'the job stopped itself on a cancel request'}",
            traceback=format_exception(exc),
            retryable=False,
        )
    if isinstance(exc, Fail | InvalidStepResult):
        # A step's result that cannot be recorded would be the same on every attempt.
        return Report(
            job_id, "error", error=_summary(exc), traceback=format_exception(exc), retryable=False
        )
    return Report(job_id, "error", error=_summary(exc), traceback=format_exception(exc))


def _call(task: Task, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run a task's function to its end: a coroutine function in an event loop of its own."""
    if task.is_async:
        return asyncio.run(task.func(*args, **kwargs))
    return task.func(*args, **kwargs)


def _summary(exc: BaseException) -> str:
    from django_jobs.sanitize import mask_text

    kind = getattr(exc, "reported_as", None) or type(exc)
    name = f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
    message = str(exc)
    return mask_text(f"{name}: {message}" if message else name)[:2000]


def run_and_report(
    assignment: Assignment,
    pipe: Pipe,
    progress: ProgressOut,
    output: Sink | None,
    watchdog: Watchdog | None = None,
) -> None:
    """Run one job and send its report down ``pipe``, after the last progress it reported;
    ``watchdog`` stops the job if the supervisor's heartbeats stop committing meanwhile."""
    if watchdog is not None:
        watchdog.running(assignment.job_id)
    job_id = assignment.job_id
    try:
        report = run_assignment(
            assignment,
            progress,
            output,
            lambda name, value_json: progress.cursor(job_id, name, value_json),
        )
    finally:
        if watchdog is not None:
            watchdog.running(None)
        progress.flush()  # however the job ended, and before its report
    pipe.send(report)


def executor_main(
    conn: Connection,
    output: Connection,
    databases: dict[str, Any],
    settings_module: str,
    stop_requested: Any,
    fence: tuple[Any, float, float] | None = None,
    parent: int | None = None,
) -> None:
    """Entry point of an executor process (started with the ``spawn`` method): jobs come on
    ``conn``, and their reports and progress go back on it; what they print and log goes to
    ``output``, raw. ``stop_requested`` is a shared byte the supervisor sets before it sends
    this process SIGTERM (worker/spawn.py). ``fence``: the supervisor's last committed
    heartbeat and the terms by which a job stops itself when heartbeats stop committing
    (worker/fence.py). ``parent``: the supervisor's pid; this process dies with it."""
    if parent is not None:
        die_with_parent(parent)
    # Ctrl-C reaches the whole process group; only the supervisor decides what stops a job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # So does a SIGTERM to the group (systemd's default KillMode=control-group, kill -TERM
    # -PGID): the supervisor drains on it, and the job must run on through --grace.
    signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, stop_requested))
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    from django.conf import settings

    # Use exactly the databases the supervisor uses (a test run's test database, say).
    settings.DATABASES = databases
    import django

    django.setup()
    from django_jobs import conf

    pipe = Pipe(conn)
    progress = ProgressOut(pipe)
    sink = Sink(output.fileno()) if conf.attempt_log_bytes() else None
    watchdog = Watchdog(fence, stop_requested) if fence is not None else None
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        try:
            run_and_report(message, pipe, progress, sink, watchdog)
        except (BrokenPipeError, OSError):
            return
        sys.stdout.flush()
        sys.stderr.flush()


def _on_sigterm(stop_requested: Any, signum: int, frame: Any) -> None:
    """Die of a SIGTERM the supervisor sent, as with no handler; ignore any other.

    The supervisor sets ``stop_requested`` before it sends SIGTERM, so the job is stopped just
    as it always was: SIGTERM's default action, then SIGKILL after ``JOBS_KILL_GRACE``. A job
    that installs its own SIGTERM handler replaces this one and sees every SIGTERM, as before.
    A Python handler runs between bytecodes: a job blocked in C code that retries on EINTR dies
    only when that call returns, or at the SIGKILL."""
    if not stop_requested.value:
        return
    # The run's span ends here, or never: the process dies of this signal.
    tracing.stopped(_RUNNING[0], "stopped")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
