"""A job's finish is sent while the supervisor's loop goes on (django_jobs/worker/round_trip.py).

The real loop, outbox and pool on the fakes of tests/unit/fakes.py, with the one thing that
makes the overlap: a :class:`RoundTrip` on a real thread. The fake queue's finish of one job
blocks until the test lets it go, as a finish waiting for its server would.
"""

from __future__ import annotations

import select
import threading
from typing import Any

import pytest

from django_jobs.worker.executor import Assignment, Report
from django_jobs.worker.round_trip import RoundTrip
from django_jobs.worker.supervisor import Supervisor
from tests.unit.fakes import Clock, FakeExecutors, FakeQueue
from tests.unit.helpers import TASK, start, step_until, supervisor

WAIT = 10.0  # seconds: only a loop that cannot overlap ever waits this long


class HeldFinishes(FakeQueue):
    """A queue whose finish of job ``held`` waits for :attr:`let_go`; counts the calls in
    flight at once."""

    def __init__(self, clock: Clock, held: int) -> None:
        super().__init__(clock)
        self.held = held
        self.entered = threading.Event()
        self.let_go = threading.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.threads: set[str] = set()

    def _call(self, op: str, job_id: int | None = None) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if op == "finish":
                self.threads.add(threading.current_thread().name)
            if op == "finish" and job_id == self.held:
                self.entered.set()
                if not self.let_go.wait(WAIT):
                    raise AssertionError("the finish was held for good: the loop never went on")
            super()._call(op, job_id)
        finally:
            self.in_flight -= 1


def overlapping(queue: FakeQueue, executors: FakeExecutors, concurrency: int) -> Supervisor:
    worker = supervisor(queue, executors, concurrency=concurrency)
    worker.gate.round_trip = RoundTrip()
    return worker


def report_later(first: int) -> Any:
    """Executors that report job ``first`` at once, and the others when the test says."""

    def behaviour(assignment: Assignment) -> Report | None:
        if assignment.job_id == first:
            return Report(assignment.job_id, "done", result_json="null")
        return None

    return behaviour


def test_an_executor_is_served_while_a_finish_is_in_flight(clock: Clock) -> None:
    queue = HeldFinishes(clock, held=1)
    first, second, third = queue.add(TASK, 3)
    executors = FakeExecutors(clock, report_later(first.id))
    worker = overlapping(queue, executors, concurrency=2)
    try:
        start(worker)
        # The loop claims both jobs, reads the first one's report and sends its finish: that
        # round trip is held, and the loop goes on.
        step_until(worker, lambda: worker.gate.busy, steps=20)
        assert queue.entered.wait(WAIT)
        assert worker.gate.busy and first.state == "running"

        # The second job ends meanwhile: its executor's report is read, and its finish queued
        # behind the one in flight (one round trip at a time on the connection).
        second_conn = next(c for c in executors.spawned if c.assignments[-1].job_id == second.id)
        second_conn.inbox.append(Report(second.id, "done", result_json="null"))
        worker._step()
        assert not second_conn.inbox
        assert worker.pool.busy() == 0
        assert [w.description for w in worker.outbox.writes] == [
            f"finish job {first.id}",
            f"finish job {second.id}",
        ]
        assert worker.gate.busy and first.state == "running"

        # Let it go: the first finish commits and claims the third job for its slot, then the
        # second finish is sent.
        queue.let_go.set()
        step_until(worker, lambda: second.state == "done" and third.state == "running")
        assert first.state == "done"
        assert queue.most_in_flight == 1
        assert queue.threads == {"django-jobs-round-trip"}
        assert [op for op in queue.ops() if op[0] in ("claim", "finish")] == [
            ("claim", None),
            ("claim", None),
            ("finish", first.id),  # with the claim of the third job
            ("finish", second.id),
        ]
    finally:
        queue.let_go.set()
        worker.gate.close()


def test_a_heartbeat_waits_for_the_finish_in_flight_and_lists_the_job_it_claimed(
    clock: Clock,
) -> None:
    queue = HeldFinishes(clock, held=1)
    first, second = queue.add(TASK, 2)
    executors = FakeExecutors(clock, report_later(first.id))
    worker = overlapping(queue, executors, concurrency=1)
    try:
        start(worker)
        step_until(worker, lambda: worker.gate.busy, steps=20)
        assert queue.entered.wait(WAIT)
        threading.Timer(0.05, queue.let_go.set).start()

        worker.heartbeats.beat()

        # The beat came after the finish, and the second job, claimed with it, runs: it is
        # no orphan.
        assert first.state == "done" and second.state == "running"
        assert [a.job_id for a in executors.assignments] == [first.id, second.id]
        assert queue.ops("finish", "heartbeat")[-2:] == [("finish", first.id), ("heartbeat", None)]
        assert second.state == "running"
    finally:
        queue.let_go.set()
        worker.gate.close()


def test_a_job_claimed_with_a_finish_in_flight_when_the_worker_stops_goes_back(
    clock: Clock,
) -> None:
    queue = HeldFinishes(clock, held=1)
    first, second = queue.add(TASK, 2)
    executors = FakeExecutors(clock, report_later(first.id))
    worker = overlapping(queue, executors, concurrency=1)
    try:
        start(worker)
        step_until(worker, lambda: worker.gate.busy, steps=20)
        assert queue.entered.wait(WAIT)
        worker.request_stop()
        queue.let_go.set()
        worker.gate.settle()
        step_until(worker, lambda: not worker.outbox)

        assert first.state == "done"
        assert second.state == "pending" and second.attempt == 0  # not counted
        assert [a.job_id for a in executors.assignments] == [first.id]
        assert ("release", second.id) in queue.ops()
    finally:
        queue.let_go.set()
        worker.gate.close()


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_round_trip_hands_its_error_to_the_loops_thread(error: BaseException) -> None:
    def fail() -> None:
        raise error

    seen: list[Any] = []
    trip = RoundTrip()
    try:
        trip.send(fail, lambda result, exc: seen.append((result, exc)))
        assert trip.busy
        assert trip.collect(wait=True)
        assert seen == [(None, error)] and not trip.busy
        assert not trip.collect(wait=True)  # nothing in flight
    finally:
        trip.close()


def test_the_loops_wait_wakes_for_the_end_of_each_call_and_for_nothing_else() -> None:
    results: list[Any] = []
    held = threading.Event()
    trip = RoundTrip()
    try:
        trip.send(lambda: 1, lambda result, exc: results.append(result))
        assert select.select([trip.fileno()], [], [], WAIT)[0] == [trip.fileno()]
        assert trip.collect(wait=False) and results == [1]

        # A call in flight: nothing is left over from the last one to wake the wait.
        trip.send(lambda: held.wait(WAIT) and 2, lambda result, exc: results.append(result))
        assert select.select([trip.fileno()], [], [], 0.1)[0] == []
        assert not trip.collect(wait=False) and trip.busy
        held.set()
        assert trip.collect(wait=True) and results == [1, 2]
        assert select.select([trip.fileno()], [], [], 0.1)[0] == []
    finally:
        held.set()
        trip.close()
