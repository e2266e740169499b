"""Jobs the test suite enqueues: each does one thing that a test wants to observe."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django_jobs import Fail, Retry, job
from django_jobs.context import JobContext
from testproject.testjobs.models import Execution


@job(name="tests.noop")
def noop() -> None:
    return None


@job(name="tests.echo", max_attempts=1)
def echo(*args: Any, **kwargs: Any) -> dict:
    return {"args": list(args), "kwargs": kwargs}


@job(name="tests.sleep", max_attempts=1)
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@job(name="tests.fail", max_attempts=1)
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@job(name="tests.fail_while", max_attempts=1)
def fail_while(path: str) -> str:
    """Fails while the file at ``path`` exists: a job that is broken until someone fixes it."""
    if os.path.exists(path):
        raise RuntimeError(f"{path} says this is broken")
    return "fixed"


@job(name="tests.fail_hard", max_attempts=5)
def fail_hard(message: str = "permanent") -> None:
    raise Fail(message)


@job(name="tests.retry_then_succeed", max_attempts=3, retry_backoff=(1.0, 1.0), takes_context=True)
def retry_then_succeed(context: JobContext, succeed_on: int = 2) -> int:
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@job(name="tests.ask_retry", max_attempts=2, takes_context=True)
def ask_retry(context: JobContext, after: float = 0.5) -> str:
    if context.attempt == 1:
        raise Retry(after=after, reason="not yet")
    return "second time lucky"


@job(name="tests.record", takes_context=True)
def record(context: JobContext, note: str = "", seconds: float = 0.0) -> int:
    """Write one ledger row per execution, then optionally sleep."""
    Execution.objects.create(
        job_id=context.job_id,
        attempt=context.attempt,
        worker_id=context.worker_id,
        pid=os.getpid(),
        note=note,
    )
    if seconds:
        time.sleep(seconds)
    return context.attempt


@job(name="tests.crash", max_attempts=1)
def crash(code: int = 3) -> None:
    os._exit(code)


@job(name="tests.segfault", max_attempts=1)
def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


@job(name="tests.stubborn_sleep", max_attempts=1)
def stubborn_sleep(seconds: float) -> None:
    """Ignores SIGTERM, so only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)


@job(name="tests.unserializable", max_attempts=1)
def unserializable() -> object:
    return object()


@job(name="tests.leak_secret", max_attempts=1)
def leak_secret(password: str) -> None:
    raise RuntimeError(f"login failed with password={password} for postgres://bob:{password}@db/x")


@job(name="tests.context", takes_context=True, max_attempts=2)
def context_job(context: JobContext) -> dict:
    return {"job_id": context.job_id, "attempt": context.attempt, "worker_id": context.worker_id}


@job(name="tests.async_echo", max_attempts=1)
async def async_echo(value: Any) -> Any:
    import asyncio

    await asyncio.sleep(0.01)
    return value


@job(name="tests.fan_out", takes_context=True, max_attempts=1)
def fan_out(context: JobContext, children: int, seconds: float = 0.0) -> int:
    """Spawn ``children`` record jobs in one statement, then return at once."""
    record.using(parent=context.job_id).enqueue_many(
        ((), {"note": f"child {i}", "seconds": seconds}) for i in range(children)
    )
    return children


@job(name="tests.tree", takes_context=True, max_attempts=1)
def tree(context: JobContext, depth: int) -> int:
    """Spawn one child a level down until depth 0, recording each level."""
    Execution.objects.create(
        job_id=context.job_id,
        attempt=context.attempt,
        worker_id=context.worker_id,
        pid=os.getpid(),
        note=f"depth {depth}",
    )
    if depth > 0:
        context.spawn(tree, depth - 1)
        context.spawn("tests.noop")
    return depth


@job(name="tests.stamp", max_attempts=1)
def stamp() -> float:
    """Return the wall-clock time at which the job function started (for latency benches)."""
    return time.time()


@job(name="tests.journal", takes_context=True)
def journal(context: JobContext, path: str, seconds: float = 0.0, tick: float = 0.05) -> dict:
    """Append this execution's start, a tick every ``tick`` seconds, and its end to the file at
    ``path``, one JSON line each: a record of who ran the job when that survives a database
    crash, for the crash tests to check against."""
    import json

    def note(event: str) -> None:
        line = {
            "job": context.job_id,
            "attempt": context.attempt,
            "pid": os.getpid(),
            "event": event,
            "t": time.time(),
        }
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")

    note("start")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(tick, left))
        note("tick")
    note("end")
    return {"job": context.job_id, "slept": seconds}


@job(name="tests.spawn_then_crash", takes_context=True, max_attempts=2, retry_backoff=(0.1, 0.1))
def spawn_then_crash(context: JobContext) -> int:
    """Attempt 1 spawns a child that fails, then dies; attempt 2 spawns one that succeeds."""
    if context.attempt == 1:
        context.spawn(fail, "child of a failed attempt")
        time.sleep(0.3)
        os._exit(3)
    context.spawn(echo, "child of the final attempt")
    return context.attempt


@job(name="tests.spawner", takes_context=True, max_attempts=1)
def spawner(context: JobContext, count: int, pause: float, queue: str = "default") -> str:
    """Spawn up to ``count`` children, one every ``pause`` seconds, until refused."""
    from django_jobs.exceptions import SpawnRefused

    for i in range(count):
        try:
            context.spawn(echo.using(queue=queue), f"child {i}")
        except SpawnRefused as exc:
            return f"refused after {i}: {exc}"
        time.sleep(pause)
    return "spawned all"


@job(name="tests.unstorable", max_attempts=1)
def unstorable(kind: str) -> Any:
    """Return or raise text PostgreSQL cannot store as it is (NUL, a lone surrogate)."""
    text = {"nul": "a\x00b", "surrogate": "a\ud800b"}[kind.removeprefix("raise_")]
    if kind.startswith("raise_"):
        raise ValueError(f"bad bytes: {text}")
    return {"text": text, f"key {text}": [text, 1]}


@job(name="tests.deep_result", max_attempts=3)
def deep_result(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


if os.environ.get("TESTJOBS_NEW_RELEASE"):
    # A task that only the workers of a newer release have (tests of rolling deploys).
    @job(name="tests.new_in_this_release", max_attempts=1)
    def new_in_this_release(n: int = 0) -> int:
        return n


# On 29 February only: every worker of the suite syncs it, and it must not fire in the middle of
# another test's run.
@job(name="tests.nightly", schedule="0 4 29 2 *", queue="reports", priority=3, timeout=600)
def nightly(*args: Any, **kwargs: Any) -> dict:
    """A periodic job declared in code (tests/integration/test_schedules.py)."""
    return {"args": list(args), "kwargs": kwargs}


@job(name="tests.progress", takes_context=True, max_attempts=2, retry_backoff=(0.1, 0.1))
def progress(
    context: JobContext,
    total: int,
    per_second: float = 1000.0,
    fail_first: bool = False,
    message: str = "item",
) -> int:
    """Report progress ``total`` times, ``per_second`` times a second; with ``fail_first``, the
    first attempt fails halfway (so the retry starts over)."""
    for done in range(1, total + 1):
        context.progress(done, total, f"{message} {done}")
        if fail_first and context.attempt == 1 and done == total // 2:
            raise RuntimeError("failed halfway")
        time.sleep(1 / per_second)
    return total


@job(name="tests.chatty", max_attempts=1, timeout=30)
def chatty(lines: int = 3, then: str = "return", line_bytes: int = 0, pause: float = 0) -> str:
    """Print ``lines`` lines (padded to ``line_bytes``), log one record at each level, then
    ``return``, ``raise``, ``crash`` (os._exit) or ``hang`` (for a timeout)."""
    import logging
    import sys

    logger = logging.getLogger("testproject.chatty")
    for i in range(lines):
        print(f"line {i}".ljust(line_bytes, "."))
    logger.debug("a debug record")
    logger.info("an info record with password=hunter2")
    logger.warning("a warning record")
    print("to stderr: token=abc123", file=sys.stderr)
    time.sleep(pause)
    if then == "raise":
        raise ValueError("chatty failed")
    if then == "crash":
        sys.stdout.flush()
        os._exit(7)
    if then == "hang":
        time.sleep(3600)
    return "said it all"


@job(name="tests.flood", takes_context=True, max_attempts=1, timeout=300)
def flood(
    context: JobContext,
    megabytes: int = 20,
    records: int = 10_000,
    progress_calls: int = 100_000,
    result_bytes: int = 0,
) -> dict:
    """Everything a job can throw at its supervisor at once: a 64 KiB line of hex (a run of
    word characters, the worst case of masking), ``megabytes`` MB of 1 KiB lines, ``records``
    log records, ``progress_calls`` progress reports in a tight loop, and a result of
    ``result_bytes`` characters."""
    import logging

    print("token=" + os.urandom(32 * 1024).hex())
    line = "x" * 1023
    for _ in range(megabytes * 1024):
        print(line)
    logger = logging.getLogger("testproject.flood")
    for i in range(records):
        logger.warning("record %d of the flood, password=hunter2", i)
    for done in range(1, progress_calls + 1):
        context.progress(done, progress_calls)
    return {"blob": "y" * result_bytes}


@job(name="tests.hold_gil", max_attempts=2)
def hold_gil(length: int = 64) -> bool:
    """Backtrack in the regex engine, which never releases the GIL: no other thread of the
    process runs until it returns, which takes forever at the default length."""
    import re

    return re.match(r"(a+)+$", "a" * length + "b") is not None


@job(name="tests.import_customer", concurrency_limit=2, max_attempts=1)
def import_customer(customer: int, seconds: float = 0.0) -> int:
    """A job limited per key: at most 2 running per customer (concurrency_key) at once."""
    time.sleep(seconds)
    return customer


@job(name="tests.rated", rate_limit="10/2s", max_attempts=1)
def rated(note: str = "", seconds: float = 0.0) -> str:
    """At most 10 starts in any 2 s, per rate key (the call's, else the task's name)."""
    time.sleep(seconds)
    return note


@job(name="tests.rated_retry", rate_limit="3/2s", max_attempts=3, retry_backoff=(0.0, 0.0))
def rated_retry() -> None:
    """Fails every attempt: each retry is a start of its own."""
    raise RuntimeError("always")


@job(name="tests.tenant_import", queue="imports", max_attempts=1)
def tenant_import(tenant: str, n: int = 0, seconds: float = 0.0) -> str:
    """A tenant's import, in the fair queue of the tests' settings."""
    time.sleep(seconds)
    return f"{tenant}:{n}"


@job(name="tests.expiring", expires_after=60, max_attempts=1)
def expiring(note: str = "") -> str:
    return note


@job(name="tests.asks_if_cancelled", takes_context=True, max_attempts=1)
def asks_if_cancelled(context: JobContext) -> bool:
    """Return what the run's context says: whether it should stop."""
    return context.is_cancelled()


def _note(path: str, **line: Any) -> None:
    """Append one JSON line to the file at ``path``: a record that survives crashes."""
    import json

    with open(path, "a") as out:
        out.write(json.dumps({**line, "pid": os.getpid(), "t": time.time()}) + "\n")
        out.flush()
        os.fsync(out.fileno())


@job(name="tests.five_steps", takes_context=True, max_attempts=5, retry_backoff=(0.1, 0.1))
def five_steps(context: JobContext, path: str, pause: float = 0.0, fail_in: int = 0) -> list:
    """Five steps, each noting its run in ``path`` and sleeping ``pause`` seconds; attempt 1 fails
    in step ``fail_in`` (0: none) after noting it."""

    def work(number: int) -> int:
        _note(path, step=number, attempt=context.attempt)
        time.sleep(pause)
        if number == fail_in and context.attempt == 1:
            raise RuntimeError(f"step {number} failed")
        return number * 10

    return [context.step(f"step {n}", work, n) for n in range(1, 6)]


@job(name="tests.cursor_loop", takes_context=True, max_attempts=5, retry_backoff=(0.1, 0.1))
def cursor_loop(context: JobContext, path: str, items: int = 40, pause: float = 0.1) -> int:
    """Work through ``items`` items, noting each in ``path``, with a cursor saved after each."""
    start = context.cursor("next", 0)
    for item in range(start, items):
        _note(path, item=item, attempt=context.attempt)
        time.sleep(pause)
        context.save_cursor("next", item + 1)
    return items


@job(name="tests.step_spawns", takes_context=True, max_attempts=3, retry_backoff=(0.1, 0.1))
def step_spawns(context: JobContext) -> int:
    """A step spawns two children; attempt 1 then fails, attempt 2 replays past the step."""
    context.step("fan out", lambda: [context.spawn(echo, i).pk for i in range(2)])
    if context.attempt == 1:
        raise RuntimeError("failed after the step")
    return context.attempt


@job(name="tests.cancellable_loop", takes_context=True, max_attempts=3)
def cancellable_loop(context: JobContext, seconds: float = 60.0, stop: str = "raise") -> str:
    """Loop until cancelled: raise Cancelled (``stop="raise"``) or return (``"return"``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop == "raise":
            context.raise_if_cancelled()
        elif context.is_cancelled():
            return "stopped early"
        time.sleep(0.05)
    return "ran to the end"


@job(name="tests.step_then_cursor", takes_context=True, max_attempts=3, retry_backoff=(0.1, 0.1))
def step_then_cursor(context: JobContext, path: str, items: int = 6, fail_at: int = 3) -> dict:
    """A step that plans ``items`` items, then a loop over them with a cursor saved after each,
    each noted in ``path``; attempt 1 fails at item ``fail_at`` (after noting it), so that attempt
    2 replays the step and resumes from the cursor."""

    def plan() -> list[int]:
        _note(path, step="plan", attempt=context.attempt)
        return list(range(items))

    todo = context.step("plan", plan)
    start = context.cursor("next", 0)
    for item in todo[start:]:
        _note(path, item=item, attempt=context.attempt)
        if item == fail_at and context.attempt == 1:
            raise RuntimeError(f"item {item} failed")
        context.save_cursor("next", item + 1)
    return {"items": len(todo), "resumed_at": start}


@job(name="tests.async_steps", takes_context=True, max_attempts=2, retry_backoff=(0.1, 0.1))
async def async_steps(context: JobContext) -> list:
    """An async job's step and cursor, through sync_to_async; attempt 1 fails after both."""
    from asgiref.sync import sync_to_async

    first = await sync_to_async(context.step)("first", lambda: context.attempt)
    start = await sync_to_async(context.cursor)("next", 0)
    await sync_to_async(context.save_cursor)("next", start + 1)
    if context.attempt == 1:
        raise RuntimeError("failed after the step")
    return [first, start]
