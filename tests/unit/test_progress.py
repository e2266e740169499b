"""context.progress(): what bad input becomes, and how often the worker writes it."""

from __future__ import annotations

import json
import time
from typing import Any, cast

import pytest

from django_jobs import sanitize
from django_jobs.context import JobContext
from django_jobs.log_tail import stored_log
from django_jobs.progress import MESSAGE_CHARS, BadProgress, Progress, checked
from django_jobs.store import Lease
from django_jobs.worker.executor import (
    SEND_PROGRESS_EVERY,
    Assignment,
    Pipe,
    ProgressOut,
    Report,
    run_and_report,
)
from django_jobs.worker.live import LiveWrites, Tail, Watch
from django_jobs.worker.outbox import Outbox
from django_jobs.worker.postgres_queue import QueueGate
from tests.conftest import wait_for
from tests.timing import BUSY_MACHINE_MARGIN, CPU_BOUND
from tests.unit.fakes import Clock, FakeQueue


def test_out_of_range_progress_is_clamped_and_a_long_message_cut() -> None:
    assert checked(1, -1) == Progress(1, 0.0, None, "")
    assert checked(1, 12, 10).done == 10
    assert checked(1, 3, 0).total is None  # a total that is not above 0 is unknown
    message = checked(1, 1, 2, "x" * 10_000).message
    assert len(message) == MESSAGE_CHARS and message.endswith("…")
    assert "\x00" not in checked(1, 1, 2, "nul\x00here").message  # PostgreSQL refuses NUL


@pytest.mark.parametrize("done", ["3", None, float("nan"), float("inf"), True, [1]])
def test_a_done_that_is_not_a_finite_number_is_refused_with_a_clear_error(done) -> None:
    with pytest.raises(BadProgress, match="done must be a"):
        checked(1, done)


def test_bad_progress_never_raises_into_the_job(caplog) -> None:
    sent: list[Progress] = []
    context = JobContext(1, "t", 1, 1, "w", report_progress=sent.append)
    context.progress("half")
    context.progress(-5, 10)
    assert sent == [Progress(1, 0.0, 10.0, "")]
    assert "done must be a number, not str" in caplog.text


def test_the_tail_keeps_the_last_bytes_from_a_line_start_with_a_marker() -> None:
    tail = Tail(100)
    for i in range(1000):
        tail.add(f"line {i} of the output\n".encode())
    text = tail.text()
    assert text.startswith("[… ") and "earlier bytes cut: the last 100 are kept …]\nline " in text
    assert text.endswith("line 998 of the output\nline 999 of the output\n")
    assert len(text.split("]\n", 1)[1].encode()) <= 100


def test_the_tail_never_keeps_the_end_of_a_line_the_cut_went_through() -> None:
    # The cut falls right after "password=", with no newline near: the bare secret that follows
    # must not be kept, unmasked, as the first thing of the tail.
    tail = Tail(4096)
    tail.add(b"x" * 10_000 + b" password=")
    tail.add(b"hunter2" + b"y" * 4000 + b"\nlast line\n")
    text = tail.text()
    assert "hunter2" not in text and text.endswith("\nlast line\n")
    assert text.startswith("[… 14,018 earlier bytes cut")


def test_a_cut_at_a_line_start_keeps_that_line() -> None:
    tail = Tail(10)
    tail.add(b"123456789\nabcdefghi\n")  # the cut takes the first line and its newline
    assert tail.text().endswith("]\nabcdefghi\n")


def test_a_log_sent_whole_is_cut_like_a_tail_and_masked() -> None:
    log = "x" * 5000 + " password=" + "hunter2\n" + "api_key=sk-123\nlast\n"
    assert stored_log(log, 100) == (
        "[… 5,018 earlier bytes cut: the last 100 are kept …]\napi_key=********\nlast\n"
    )
    assert stored_log("short password=hunter2\n", 100) == "short password=********\n"
    assert stored_log("nul\x00", 100).startswith("nul\\x00 [django-jobs: NUL")
    assert stored_log("anything", 0) == ""


def test_a_tail_cut_before_it_was_sent_keeps_its_count_and_is_not_cut_again() -> None:
    # A worker of the HTTP API sends its tail as a worker of this app keeps it.
    tail = Tail(1000)
    for i in range(500):
        tail.add(f"line {i:03d} {'.' * 20}\n".encode())
    sent = tail.text()
    assert sent.startswith("[… 14,010 earlier bytes cut") and len(sent.encode()) > 1000
    assert stored_log(sent, 1000) == sent
    smaller = stored_log(sent, 500)
    assert smaller.startswith("[… 14,520 earlier bytes cut: the last 500 are kept …]\nline 484 ")


def test_the_supervisor_never_masks_a_jobs_output(monkeypatch) -> None:
    """The executor masks what its job writes (worker/capture.py); the supervisor's side, from
    the bytes read off the output pipe to the live write, masks nothing: with masking made to
    fail, a megabyte of adversarial output still goes through, as it came."""

    def masked(*args: Any) -> str:
        raise AssertionError("the supervisor masked a job's output")

    monkeypatch.setattr(sanitize, "_mask_key_values", masked)
    monkeypatch.setattr(sanitize, "_mask_urls", masked)
    clock = Clock()
    queue = FakeQueue(clock)
    outbox = Outbox(QueueGate(queue))
    live = LiveWrites(queue, outbox, interval=0.5, clock=clock)
    watch = Watch(Lease(1, 1, "w", "token"), Tail(64 * 1024))
    hex_line = b"0123456789abcdef" * 1536 + b"\n"  # 24 KiB
    started = time.thread_time()  # CPU time: other processes on the cores do not add to it
    for i in range(40):  # about 1 MiB, a live write every few lines
        watch.printed(hex_line + f"password=******** line {i}\n".encode())
        live.step([watch])
        outbox.flush()
        clock.advance_to(clock.now + 0.2)
    live.last(watch)
    outbox.flush()
    logs = [log for _, _, log in queue.live if log is not None]
    assert len(logs) > 10 and logs[-1].endswith("password=******** line 39\n")
    # Milliseconds; masking or copying the whole tail at each write would take seconds.
    assert time.thread_time() - started < CPU_BOUND


def test_a_thousand_reports_a_second_make_one_write_per_interval_and_the_last() -> None:
    clock = Clock()
    queue = FakeQueue(clock)
    outbox = Outbox(QueueGate(queue))
    live = LiveWrites(queue, outbox, interval=2.0, clock=clock)
    watch = Watch(Lease(1, 1, "w", "token"), Tail(1024))
    for done in range(1, 10_001):  # ten seconds at 1,000 a second
        watch.reported(Progress(1, done, 10_000))
        live.step([watch])
        outbox.flush()
        clock.advance_to(clock.now + 0.001)
    live.last(watch)
    outbox.flush()
    writes = [progress for _, progress, _ in queue.live]
    assert len(writes) == 6  # at 0, 2, 4, 6, 8 s, and the last
    assert writes[-1] == Progress(1, 10_000, 10_000)


class Recorded:
    """The executor's end of a pipe, keeping what is sent down it."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("fail", [False, True])
def test_rapid_reports_are_sent_a_few_times_and_the_last_before_the_report(fail: bool) -> None:
    conn = Recorded()
    pipe = Pipe(cast(Any, conn))
    kwargs = {"total": 10_000, "per_second": 1e9, "fail_first": fail}
    assignment = Assignment(7, "tests.progress", 1, 2, "w", "[]", json.dumps(kwargs))
    started = time.monotonic()
    run_and_report(assignment, pipe, ProgressOut(pipe), None)
    elapsed = time.monotonic() - started
    reports = [m for m in conn.sent if isinstance(m, Progress)]
    # One send per SEND_PROGRESS_EVERY at most while the job ran, and the last at its end.
    assert len(reports) <= elapsed / SEND_PROGRESS_EVERY + 2 and len(reports) < 1_000
    last, report = conn.sent[-2:]
    # The job's last value, then its report, whether it returned or raised halfway.
    done = 5_000 if fail else 10_000
    assert last == Progress(7, done, 10_000, f"item {done}")
    assert isinstance(report, Report) and report.outcome == ("error" if fail else "done")


def test_a_report_is_sent_within_the_interval_even_when_no_other_call_follows() -> None:
    conn = Recorded()
    every = 0.3
    out = ProgressOut(Pipe(cast(Any, conn)), every=every)
    context = JobContext(1, "t", 1, 1, "w", report_progress=out)
    before = time.monotonic()
    context.progress(1, 10)
    # The first goes out at once; a busy machine may delay the sending thread.
    wait_for(lambda: conn.sent, timeout=BUSY_MACHINE_MARGIN, interval=0.01)
    context.progress(2, 10)
    assert conn.sent == [Progress(1, 1, 10)]  # held until the interval is over...
    # ...then sent unasked, once the interval is over (without that, never).
    wait_for(lambda: len(conn.sent) == 2, timeout=every + BUSY_MACHINE_MARGIN, interval=0.01)
    assert conn.sent[1] == Progress(1, 2, 10) and time.monotonic() - before >= every
    out.flush()
    assert len(conn.sent) == 2  # nothing was left to send
