"""What the supervisor does per job, counted rather than timed: the log lines it builds, the
messages it writes to an executor's pipe, the poll set it waits on."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_jobs import logs
from django_jobs.progress import Progress
from django_jobs.store import ClaimedJob, Lease
from django_jobs.worker import outcomes
from django_jobs.worker.executor import Assignment, Report
from django_jobs.worker.process_pool import ExecutorPool, Poller
from django_jobs.worker.slots import Reported, Slot
from django_jobs.worker.spawn import READ_SIZE, ExecutorEnd
from django_jobs.worker.supervisor import Supervisor
from tests.unit.fakes import Clock, FakeExecutors, FakeProcess, FakeQueue
from tests.unit.helpers import TASK


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("django_jobs")
    level = logger.level
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def burst(clock: Clock, jobs: int) -> Supervisor:
    queue = FakeQueue(clock)
    queue.add(TASK, jobs)
    executors = FakeExecutors(clock)
    worker = Supervisor(
        concurrency=2,
        install_signals=False,
        listen=False,
        poll_interval=1.0,
        db=queue,
        duties=queue,
        pool=executors.pool(2),
        scheduler=False,
        burst=True,
    )
    assert worker.run() == 0
    return worker


def count_fields(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built: list[int] = []
    job_fields = outcomes.job_fields

    def counted(job: ClaimedJob, worker_id: str) -> dict[str, Any]:
        built.append(job.id)
        return job_fields(job, worker_id)

    monkeypatch.setattr(outcomes, "job_fields", counted)
    return built


def test_below_info_a_job_s_claim_and_finish_build_no_log_line(
    clock: Clock, records: Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("django_jobs").setLevel(logging.WARNING)
    built = count_fields(monkeypatch)

    worker = burst(clock, 5)

    assert worker.stats.claimed == worker.stats.done == 5
    assert built == [] and records.records == []


def test_at_info_each_job_has_its_claim_and_finish_line_with_their_fields(
    clock: Clock, records: Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("django_jobs").setLevel(logging.INFO)
    built = count_fields(monkeypatch)

    worker = burst(clock, 3)

    per_job = [r for r in records.records if getattr(r, "event", None) in ("claim", "finish")]
    assert len(per_job) == 6 and len(built) == 6  # one dict per line, and no copies of it
    claim = next(r for r in per_job if r.event == "claim")  # type: ignore[attr-defined]
    assert (
        claim.getMessage() == f"job {claim.job_id} claimed: task={TASK} queue=default attempt=1/3"
    )  # type: ignore[attr-defined]
    finish = next(r for r in per_job if r.event == "finish")  # type: ignore[attr-defined]
    for field, value in {
        "task": TASK,
        "queue": "default",
        "attempt": 1,
        "worker_id": worker.worker_id,
        "outcome": "done",
        "state": "done",
        "duration": 0.0,
    }.items():
        assert getattr(finish, field) == value, field


def test_the_text_log_formats_its_time_as_logging_does_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, theirs = (
        logs.TextFormatter(),
        logging.Formatter("%(asctime)s %(levelname)-7s %(message)s"),
    )
    strftime = time.strftime
    calls: list[str] = []

    def counted(fmt: str, *args: Any) -> str:
        calls.append(fmt)
        return strftime(fmt, *args)

    monkeypatch.setattr(logs.time, "strftime", counted)
    moments = [
        1_000_000_000.0004,
        1_000_000_000.5,
        1_000_000_000.9996,
        1_000_000_001.0,
        1_735_689_599.999,
    ]
    for created in moments:
        record = logging.LogRecord(
            "django_jobs.worker", logging.INFO, __file__, 1, "job %d", (7,), None
        )
        record.created = created
        record.msecs = int((created - int(created)) * 1000) + 0.0
        assert ours.format(record) == theirs.format(record)
    # Ours: once per second it saw (3); logging's: once per line.
    assert len(calls) == 3 + len(moments)


def test_a_job_is_handed_to_its_executor_in_one_message_that_recv_reads() -> None:
    pool = ExecutorPool(1, kill_grace=5.0, spawn=lambda index: (None, None, None))
    supervisor_end, executor_end = multiprocessing.Pipe()
    slot = Slot(index=0, process=FakeProcess(1), conn=ExecutorEnd(supervisor_end))  # type: ignore[arg-type]
    lease = Lease(42, 2, "w:1:abc", "token")
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job = ClaimedJob(
        lease,
        7,
        TASK,
        "default",
        "[1]",
        '{"a": 2}',
        3,
        None,
        None,
        trace_context={"traceparent": traceparent},
    )

    pool.assign(slot, job)

    assert executor_end.recv() == Assignment(
        job_id=42,
        task=TASK,
        attempt=2,
        max_attempts=3,
        worker_id="w:1:abc",
        args_json="[1]",
        kwargs_json='{"a": 2}',
        lease="token",
        queue="default",
        trace_context={"traceparent": traceparent},
    )
    assert not executor_end.poll(0)  # and nothing else
    supervisor_end.close()
    executor_end.close()


def test_a_report_says_how_much_output_there_was_so_none_is_looked_for_when_there_was_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = ExecutorPool(1, kill_grace=5.0, spawn=lambda index: (None, None, None))
    supervisor_end, executor_end = multiprocessing.Pipe()
    output, executor_output = multiprocessing.Pipe(duplex=False)
    os.set_blocking(output.fileno(), False)
    slot = Slot(0, FakeProcess(1), ExecutorEnd(supervisor_end), output)  # type: ignore[arg-type]
    pool.slots = [slot]
    reads: list[int] = []
    read = os.read

    def counted(fd: int, size: int) -> bytes:
        reads.append(fd)
        return read(fd, size)

    monkeypatch.setattr(os, "read", counted)
    try:
        for number, printed in enumerate([b"", b"hello\n", b""], start=1):
            job = ClaimedJob(
                Lease(number, 1, "w:1:abc", "t"), 1, TASK, "q", "[]", "{}", 1, None, None
            )
            pool.assign(slot, job)
            executor_end.recv()
            os.write(executor_output.fileno(), printed)
            written = slot.output_read + len(printed)
            executor_end.send(Report(number, "done", output_bytes=written))
            # Only the report is seen ready, as when the wait looked at the output pipe just
            # before the job printed: the count says whether to read it.
            (reported,) = pool.events([slot.conn])
            assert isinstance(reported, Reported) and reported.watch is not None
            assert reported.watch.tail.text() == printed.decode()
            # One read for the report; one for the output, only if there was some.
            assert reads.count(slot.conn.fileno()) == 1
            assert reads.count(output.fileno()) == (1 if printed else 0), number
            reads.clear()
    finally:
        for conn in (supervisor_end, executor_end, output, executor_output):
            conn.close()


def test_what_an_executor_sends_is_read_whole_and_in_one_read_for_all_that_waits() -> None:
    supervisor_end, executor_end = multiprocessing.Pipe()
    end = ExecutorEnd(supervisor_end)
    try:
        # A job's last progress and its report, in the pipe together: one read for both.
        progress = Progress(job_id=7, done=3, total=4)
        report = Report(7, "done", result_json="null", output_bytes=0)
        executor_end.send(progress)
        executor_end.send(report)
        assert end.messages() == [progress, report]
        # Longer than Connection.send writes at once (16 KiB), and than one read (READ_SIZE):
        # what has not wholly arrived waits for the next read.
        big = Report(8, "error", traceback="x" * (READ_SIZE + 100))
        sender = threading.Thread(target=lambda: [executor_end.send(m) for m in (big, "ready")])
        sender.start()
        received: list[Any] = []
        reads = 0
        while len(received) < 2:
            received += end.messages()
            reads += 1
        sender.join()
        assert received == [big, "ready"] and reads >= 2
        assert end.partial == bytearray()
        executor_end.close()
        with pytest.raises(EOFError):
            end.messages()
    finally:
        supervisor_end.close()


def test_the_poll_set_is_kept_between_waits_until_what_is_waited_on_changes() -> None:
    first, second = multiprocessing.Pipe(), multiprocessing.Pipe()
    reader, writer = os.pipe()
    try:
        poller = Poller()
        waitables: list[Any] = [first[0], reader]
        assert poller(list(waitables), 0) == []
        kept = poller._poll
        second[1].send("hello")
        assert poller(list(waitables), 0) == [] and poller._poll is kept
        first[1].send("hello")
        os.write(writer, b"x")
        assert set(map(id, poller(list(waitables), 0.01))) == {id(first[0]), id(reader)}
        assert poller._poll is kept
        # An executor replaced: the new pipe is waited on, the old one no more.
        assert poller([second[0], reader], 0) == [second[0], reader]
        assert poller._poll is not kept
    finally:
        for conn in (*first, *second):
            conn.close()
        os.close(reader)
        os.close(writer)
