"""The fence's terms, and the worker's log written off its loop."""

from __future__ import annotations

import logging
import threading

import pytest

from django_jobs.worker.background_log import BackgroundLog
from django_jobs.worker.fence import FENCE_SLACK, Fence, fence_after


def test_a_job_stops_its_kill_grace_and_the_slack_before_the_worker_timeout() -> None:
    assert fence_after(60, 5) == 60 - 5 - FENCE_SLACK == 53
    # Too short a timeout for the margin: no earlier than three quarters of it.
    assert fence_after(2, 1) == 1.5
    assert fence_after(6, 5) == 4.5


def test_the_supervisor_writes_the_moment_its_heartbeat_was_sent_where_executors_read_it() -> None:
    fence = Fence(60, 5)
    last_beat, after, kill_grace = fence.terms()
    assert last_beat.value == float("-inf") and (after, kill_grace) == (53, 5)
    fence.committed(123.5)
    assert last_beat.value == 123.5


class Blocked(logging.Handler):
    """A handler whose output is blocked until ``open`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.open.wait(10)
        self.lines.append(record.getMessage())


def test_a_blocked_log_output_costs_log_lines_not_the_callers_time() -> None:
    logger = logging.getLogger("django_jobs.test_background_log")
    handler = Blocked()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with BackgroundLog(logger.name, capacity=3):
            for i in range(10):
                logger.warning("line %d", i)  # returns at once, though the output is blocked
            handler.open.set()
        kept = [line for line in handler.lines if line.startswith("line")]
        notes = [line for line in handler.lines if not line.startswith("line")]
        # The first ones, in order (the queue's 3, and the one being written at most), and
        # one line that counts the rest.
        assert kept == [f"line {i}" for i in range(len(kept))] and 3 <= len(kept) <= 4
        assert len(notes) == 1
        assert notes[0].startswith(f"{10 - len(kept)} log record(s) of this worker were dropped")
        assert logger.handlers == [handler] and not logger.propagate
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("propagate", [True, False])
def test_records_reach_the_handlers_they_would_have_reached(propagate: bool) -> None:
    parent = logging.getLogger("django_jobs.test_bg_parent")
    child = logging.getLogger("django_jobs.test_bg_parent.child")
    seen = Blocked()
    seen.open.set()
    parent.addHandler(seen)
    parent.propagate = False
    child.propagate = propagate
    try:
        with BackgroundLog(child.name):
            child.warning("hello %s", "there")
        assert seen.lines == (["hello there"] if propagate else [])
    finally:
        parent.removeHandler(seen)
        child.propagate = True
