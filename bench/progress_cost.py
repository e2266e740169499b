#!/usr/bin/env python3
"""What ``context.progress()`` costs a job, per call, inside an executor: 100,000 calls in a row,
with the executor's real pipe to a process standing in for the supervisor (which reads every
message, as the supervisor's loop does). Target: under 5 µs a call.

    python bench/progress_cost.py               # with the project's virtualenv (.venv/bin/python)
    python bench/progress_cost.py --unthrottled # every call sent down the pipe (the old way)

Prints the µs per call (wall clock, and the job thread's own CPU time, which a busy machine
disturbs less), the empty loop's time for reference, and how many messages reached the
supervisor's end, with the last value (which must be the last call's).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = 100_000


def supervisor(conn: Connection) -> None:
    """Read messages until ``None``, then answer how many came, and the last."""
    count, last = 0, None
    while (message := conn.recv()) is not None:
        count, last = count + 1, message
    conn.send((count, last))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    settings.configure()  # the defaults are enough: no database is used
    import django

    django.setup()
    from django_jobs.context import JobContext
    from django_jobs.worker.executor import Pipe, ProgressOut

    unthrottled = "--unthrottled" in sys.argv[1:]
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe(duplex=True)  # as worker/spawn.py makes an executor's pipe
    reader = spawn.Process(target=supervisor, args=(theirs,), daemon=True)
    reader.start()
    pipe = Pipe(ours)
    out = ProgressOut(pipe)
    context = JobContext(1, "bench", 1, 1, "w", report_progress=pipe.send if unthrottled else out)

    started, cpu = time.perf_counter(), time.thread_time()
    for done in range(1, CALLS + 1):
        context.progress(done, CALLS, "item")
    elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
    started = time.perf_counter()
    for _ in range(1, CALLS + 1):
        pass
    empty = time.perf_counter() - started

    out.flush()  # what the executor does when the job ends
    pipe.send(None)
    count, last = ours.recv()
    reader.join()
    print(f"{'unthrottled' if unthrottled else 'throttled'}: {CALLS:,} calls in {elapsed:.3f} s")
    print(f"  {elapsed / CALLS * 1e6:.2f} µs a call (empty loop: {empty * 1e3:.1f} ms)")
    print(f"  {cpu / CALLS * 1e6:.2f} µs of the job thread's CPU a call")
    print(f"  {count:,} messages sent; the last: done={last.done:,.0f} of {last.total:,.0f}")


if __name__ == "__main__":
    main()
