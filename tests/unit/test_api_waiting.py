"""Long polling's hand-out rules (django_jobs.api.waiting), without a database: one waiter
woken per notification, wakes kept while a claim runs and passed on, one tick per queue set."""

from __future__ import annotations

import asyncio

from django_jobs.api.waiting import ANY, Dispatcher
from tests.timing import BUSY_MACHINE_MARGIN


def run(coroutine_function) -> None:
    asyncio.run(coroutine_function())


def test_a_notification_wakes_one_waiter_of_its_queue_the_longest_waiting() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        first, second = dispatcher.join(["a"]), dispatcher.join(["a", "b"])
        other = dispatcher.join(["c"])
        dispatcher.notify("a")
        assert (first.wakes, second.wakes, other.wakes) == (["a"], [], [])
        await asyncio.sleep(0)
        assert first.event.is_set() and not second.event.is_set()
        dispatcher.notify("a")  # the first is woken already: the next one
        assert (first.wakes, second.wakes) == (["a"], ["a"])
        dispatcher.notify("b")  # only the second serves b; it is woken: it claims again
        assert second.wakes == ["a", "b"] and other.wakes == []
        assert dispatcher.handed == 3 and dispatcher.notifications == 3

    run(scenario)


def test_a_waiter_that_serves_every_queue_is_woken_for_any() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        everything = dispatcher.join(None)
        dispatcher.notify("whatever")
        assert everything.wakes == ["whatever"]

    run(scenario)


def test_a_claim_answers_the_wakes_before_it_and_a_job_passes_one_on() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        claimer, next_in_line = dispatcher.join(["a"]), dispatcher.join(["a"])
        dispatcher.notify("a")
        assert dispatcher.take(claimer) == ["a"] and not claimer.event.is_set()
        assert not dispatcher.pending(claimer)
        # While it claims, another notification: it goes to the idle waiter.
        dispatcher.notify("a")
        assert next_in_line.wakes == ["a"]
        dispatcher.take(next_in_line)
        # The claimer got a job: it passes its wake on, to the one idle waiter left.
        dispatcher.leave(claimer, pass_on=["a"])
        assert next_in_line.wakes == ["a"] and dispatcher.waiting() == 1

    run(scenario)


def test_wakes_a_leaving_waiter_did_not_claim_for_go_to_another() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        leaving, staying = dispatcher.join(["a"]), dispatcher.join(["a"])
        dispatcher.notify("a")
        dispatcher.notify("a")  # both woken now
        dispatcher.take(staying)
        dispatcher.leave(leaving)  # it timed out with a wake it never claimed for
        assert staying.wakes == ["a"]
        dispatcher.leave(staying)
        assert dispatcher.waiting() == 0
        dispatcher.notify("a")  # nobody waits: nothing to do (polling finds the job)
        assert dispatcher.handed == 3

    run(scenario)


def test_a_tick_wakes_one_idle_waiter_per_set_of_queues() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        a1, a2 = dispatcher.join(["a"]), dispatcher.join(["a"])
        b1 = dispatcher.join(["b"])
        dispatcher.tick()
        assert (a1.wakes, a2.wakes, b1.wakes) == ([ANY], [], [ANY])
        dispatcher.tick()  # a1 and b1 have not claimed yet: no more wakes for their sets
        assert (a1.wakes, a2.wakes, b1.wakes) == ([ANY], [], [ANY])

    run(scenario)


def test_a_tick_asks_about_the_idle_waiters_queues_and_wakes_one_per_ready_queue() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        assert dispatcher.wanted() is None
        sets = [dispatcher.join([f"q{i}", "shared"]) for i in range(300)]
        every = dispatcher.join(None)
        queues, any_queue = dispatcher.wanted() or ([], False)
        assert len(queues) == 301 and "shared" in queues and any_queue
        dispatcher.ready(set())  # nothing is ready: nobody is woken
        assert dispatcher.handed == 0
        dispatcher.ready({"q7", "shared", ANY})
        assert sets[7].wakes == ["q7"] and sets[0].wakes == ["shared"] and every.wakes == [ANY]
        assert dispatcher.handed == 3
        dispatcher.ready({"q7", "shared"})  # woken already: their claims take the jobs
        assert dispatcher.handed == 3
        dispatcher.ready({"q8"})
        assert sets[8].wakes == ["q8"]
        queues, any_queue = dispatcher.wanted() or ([], False)
        assert "q7" not in queues and "q8" not in queues and not any_queue

    run(scenario)


def test_a_waiter_wakes_when_handed_a_wake_and_times_out_otherwise() -> None:
    async def scenario() -> None:
        dispatcher = Dispatcher(listen=False)
        waiter = dispatcher.join(["a"])
        loop = asyncio.get_running_loop()
        started = loop.time()
        await waiter.wait(0.05)
        assert loop.time() - started >= 0.04
        # Woken (or hung up on) after 0.01 s, it returns then; one that missed it would wait out
        # its 60 s, far past what a busy machine adds.
        loop.call_later(0.01, dispatcher.notify, "a")
        started = loop.time()
        await waiter.wait(60)
        assert waiter.wakes == ["a"] and loop.time() - started < 0.01 + BUSY_MACHINE_MARGIN
        dispatcher.take(waiter)
        hangup = loop.create_future()
        loop.call_later(0.01, hangup.set_result, {"type": "http.disconnect"})
        started = loop.time()
        await waiter.wait(60, hangup)  # its client hung up: no more waiting
        assert hangup.done() and loop.time() - started < 0.01 + BUSY_MACHINE_MARGIN

    run(scenario)
