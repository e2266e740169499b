"""Periodic jobs without a database: cron expressions and shortcuts, the next fire time across
daylight saving changes (fixed clocks, against cronsim), what a late tick does, the checks of
a declaration, and the scheduler step of a worker's loop on the fakes."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from django_jobs.exceptions import InvalidOption
from django_jobs.schedules import cron
from django_jobs.schedules.declarations import declared, validate_schedule
from django_jobs.schedules.runner import SLACK
from django_jobs.worker.supervisor import Supervisor
from tests.unit.fakes import Clock, FakeExecutors, FakeQueue, FakeSchedule
from tests.unit.helpers import TASK

BERLIN = "Europe/Berlin"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# ---------------------------------------------------------------------- expressions


@pytest.mark.parametrize(
    ("shortcut", "expression"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
        ("  0   3 * * *  ", "0 3 * * *"),
    ],
)
def test_shortcuts_and_spacing_expand_to_five_fields(shortcut: str, expression: str) -> None:
    assert cron.expand(shortcut) == expression


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("@fortnightly", "unknown cron shortcut '@fortnightly'; use one of @yearly"),
        ("0 3 * *", "has 4 field(s); it needs 5: minute hour day-of-month month day-of-week"),
        ("0 0 3 * * *", "has 6 field(s)"),
        ("61 * * * *", "invalid cron expression '61 * * * *'"),
        ("0 3 31 2 *", "invalid cron expression"),
        ("", "a cron expression must be a non-empty string"),
    ],
)
def test_invalid_expressions_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(InvalidOption, match=re.escape(message)):
        cron.expand(expression)


def test_an_unknown_time_zone_is_named() -> None:
    with pytest.raises(InvalidOption, match="unknown timezone 'Mars/Olympus'; use an IANA name"):
        cron.zone("Mars/Olympus")


# ---------------------------------------------------------------------- next fire times


def fires(expression: str, timezone: str, after: datetime, count: int) -> list[datetime]:
    found = []
    for _ in range(count):
        after = cron.next_fire(expression, timezone, after)
        found.append(after)
    return found


def test_a_daily_0230_berlin_job_runs_once_on_the_spring_forward_day() -> None:
    # 2026-03-29: clocks jump from 02:00 to 03:00; 02:30 does not exist, it runs at 03:00 CEST.
    got = fires("30 2 * * *", BERLIN, utc(2026, 3, 27, 12), 3)
    assert got == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]


def test_a_daily_0230_berlin_job_runs_once_on_the_fall_back_day() -> None:
    # 2026-10-25: 02:00 to 03:00 happens twice; the job runs at the first 02:30 (CEST) only.
    got = fires("30 2 * * *", BERLIN, utc(2026, 10, 24, 12), 3)
    assert got == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]
    # A scheduler that looks during the repeated hour (after the first 02:30) does not run it
    # again at the second.
    assert cron.next_fire("30 2 * * *", BERLIN, utc(2026, 10, 25, 1, 10)) == utc(
        2026, 10, 26, 1, 30
    )


def test_the_next_fire_time_is_strictly_after_the_clock_and_in_utc() -> None:
    assert cron.next_fire("0 3 * * *", "UTC", utc(2026, 12, 1, 3)) == utc(2026, 12, 2, 3)
    assert cron.next_fire("@hourly", "UTC", utc(2026, 12, 1, 3, 0, 0, 1)) == utc(2026, 12, 1, 4)
    assert cron.next_fire("0 9 * * 1", BERLIN, utc(2026, 12, 1)).tzinfo == UTC


# ---------------------------------------------------------------------- late ticks


NOW = utc(2026, 12, 1, 12, 0, 30)


def test_a_tick_seen_in_time_runs_and_the_next_is_after_now() -> None:
    plan = cron.plan("* * * * *", "UTC", utc(2026, 12, 1, 12), NOW, "skip", 120)
    assert plan == cron.Plan(utc(2026, 12, 1, 12), 0, utc(2026, 12, 1, 12, 1))
    assert plan.skipped_note() == ""


def test_skip_runs_nothing_after_a_downtime_longer_than_the_grace() -> None:
    plan = cron.plan("*/10 * * * *", "UTC", utc(2026, 12, 1, 11, 20), NOW, "skip", 10)
    assert plan.fire_at is None and plan.skipped == 5  # 11:20 to 12:00, the last 30 s late
    assert plan.next_run_at == utc(2026, 12, 1, 12, 10)


def test_skip_runs_only_the_latest_tick_when_it_is_within_the_grace() -> None:
    plan = cron.plan("* * * * *", "UTC", utc(2026, 12, 1, 11, 55), NOW, "skip", 120)
    assert plan.fire_at == utc(2026, 12, 1, 12) and plan.skipped == 5
    assert plan.skipped_note() == "skipped 5 missed ticks"


def test_latest_runs_the_latest_missed_tick_once_however_late() -> None:
    due = utc(2026, 11, 28, 3)
    plan = cron.plan("0 3 * * *", "UTC", due, NOW + timedelta(hours=2), "latest", 120)
    assert plan.fire_at == utc(2026, 12, 1, 3) and plan.skipped == 3
    assert plan.next_run_at == utc(2026, 12, 2, 3)


def test_a_very_long_downtime_is_not_counted_tick_by_tick() -> None:
    plan = cron.plan("* * * * *", "UTC", NOW - timedelta(days=30), NOW, "latest", 120)
    assert plan.fire_at == utc(2026, 12, 1, 12) and plan.skipped == cron.MAX_COUNTED + 1
    assert plan.skipped_note() == f"skipped at least {cron.MAX_COUNTED + 1} missed ticks"
    assert plan.next_run_at == utc(2026, 12, 1, 12, 1)


# ---------------------------------------------------------------------- declarations


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (("tests.noop", "0 3 * *"), "has 4 field"),
        (("tests.noop", "0 3 * * *", "Europe/Atlantis"), "unknown timezone 'Europe/Atlantis'"),
        (("no.such.task", "0 3 * * *"), "task 'no.such.task' is not registered"),
        (("tests.noop", "0 3 * * *", "UTC", [object()]), r"args\[0\] is a object"),
        (("tests.noop", "0 3 * * *", "UTC", [], {"when": float("nan")}), "JSON cannot represent"),
    ],
)
def test_validate_schedule_names_the_problem(call: tuple, message: str) -> None:
    with pytest.raises(InvalidOption, match=message):
        validate_schedule(*call)


def test_validate_schedule_checks_the_options_too() -> None:
    with pytest.raises(InvalidOption, match="schedule 'x': catch_up must be 'skip' or 'latest'"):
        validate_schedule("tests.noop", "@daily", catch_up="all", name="x")
    with pytest.raises(InvalidOption, match="priority must be an integer from -100 to 100"):
        validate_schedule("tests.noop", "@daily", priority=500)
    validate_schedule("tests.noop", "@daily", "Europe/Berlin", [1], {"a": "b"}, overlap="skip")
    with pytest.raises(InvalidOption, match="when_queue_paused must be 'skip' or 'enqueue'"):
        validate_schedule("tests.noop", "@daily", when_queue_paused="wait")
    validate_schedule("tests.noop", "@daily", when_queue_paused="enqueue")


def test_declared_schedules_come_from_the_setting_and_bad_ones_are_reported(settings) -> None:
    settings.JOBS_SCHEDULES = {
        "good": {"task": "tests.noop", "cron": "@hourly", "timezone": BERLIN},
        "bad": {"task": "tests.noop", "cron": "every day"},
        "typo": {"task": "tests.noop", "cron": "@daily", "tz": "UTC"},
    }
    valid, errors = declared()
    assert "good" in {d.name for d in valid} and {"bad", "typo"} <= set(errors)
    assert "has 2 field(s)" in errors["bad"] and "unknown keys ['tz']" in errors["typo"]


# ---------------------------------------------------------------------- the worker's step


def scheduling_worker(queue: FakeQueue, clock: Clock) -> Supervisor:
    worker = Supervisor(
        install_signals=False,
        listen=False,
        poll_interval=1.0,
        db=queue,
        duties=queue,
        pool=FakeExecutors(clock).pool(1),
    )
    worker.scheduler.interval = 30.0
    worker.pool.start()
    worker.heartbeats.beat()
    return worker


def run_for(worker: Supervisor, clock: Clock, seconds: float) -> int:
    """Run the loop for ``seconds`` of the fake clock; return how many passes it made."""
    end, steps = clock.now + seconds, 0
    while clock.now < end:
        worker._step()
        steps += 1
    return steps


def test_the_worker_wakes_for_each_tick_and_fires_it_once(clock: Clock) -> None:
    queue = FakeQueue(clock)
    every_minute = FakeSchedule("m", every=60.0, due=1030.0)
    queue.schedules.append(every_minute)
    worker = scheduling_worker(queue, clock)

    run_for(worker, clock, 300)

    assert queue.ops("sync_schedules") == [("sync_schedules", None)]  # once, at the start
    assert every_minute.fired == pytest.approx([1030 + 60 * i for i in range(5)], abs=2 * SLACK)
    # Between ticks it looks at most every JOBS_SCHEDULER_INTERVAL (an edit is noticed).
    looks = [at for at, op, _ in queue.calls if op == "fire_schedules"]
    assert max(b - a for a, b in itertools.pairwise(looks)) <= 30.0 + SLACK
    assert worker.scheduler.fired == 5


def test_an_outage_backs_the_scheduler_off_and_the_missed_tick_fires_once(clock: Clock) -> None:
    queue = FakeQueue(clock)
    schedule = FakeSchedule("m", every=60.0, due=1010.0)
    queue.schedules.append(schedule)
    worker = scheduling_worker(queue, clock)
    queue.down_until = 1005.0 + 100  # the database is away across the ticks of 1010 and 1070

    steps = run_for(worker, clock, 200)

    assert steps < 200  # it waits for the queue's backoff: no busy loop while the server is away
    # The ticks of 1010 and 1070 fire once, after the outage; then those of 1130 and 1190.
    assert len(schedule.fired) == 3 and queue.down_until <= schedule.fired[0] < 1130
    assert schedule.fired[1:] == pytest.approx([1130, 1190], abs=2 * SLACK)


def test_a_failed_sync_is_retried_and_a_scheduler_syncs_again_after_an_outage(
    clock: Clock,
) -> None:
    queue = FakeQueue(clock)
    schedule = FakeSchedule("m", every=60.0, due=1010.0)
    queue.schedules.append(schedule)
    queue.failures["sync_schedules", None] = [psycopg.errors.DivisionByZero("bad")] * 2
    worker = scheduling_worker(queue, clock)

    run_for(worker, clock, 100)
    syncs = [at for at, op, _ in queue.calls if op == "sync_schedules"]
    assert len(syncs) == 3  # two failed, then one that held: not once per process
    assert schedule.fired and schedule.fired[0] >= syncs[-1]  # ticks fire after a sync held

    queue.down_until = clock.now + 30  # the server crashed, or failed over, and came back
    run_for(worker, clock, 120)
    after = [at for at, op, _ in queue.calls if op == "sync_schedules"][3:]
    assert len(after) == 1 and after[0] >= queue.down_until  # synced again, once, when back
    fires = [at for at, op, _ in queue.calls if op == "fire_schedules" and at > after[0]]
    assert fires and min(fires) >= after[0]


def test_a_stopping_worker_fires_no_more_ticks(clock: Clock) -> None:
    queue = FakeQueue(clock)
    schedule = FakeSchedule("m", every=60.0, due=1010.0)
    queue.schedules.append(schedule)
    worker = scheduling_worker(queue, clock)
    worker.request_stop()
    worker._step()
    assert worker.scheduler.due_at == float("inf") and not schedule.fired


def test_no_scheduler_makes_no_schedule_calls(clock: Clock) -> None:
    queue = FakeQueue(clock)
    queue.schedules.append(FakeSchedule("m", every=60.0, due=1010.0))
    worker = Supervisor(
        install_signals=False,
        listen=False,
        poll_interval=1.0,
        db=queue,
        duties=queue,
        pool=FakeExecutors(clock).pool(1),
        scheduler=False,
    )
    worker.pool.start()
    run_for(worker, clock, 120)
    assert not queue.ops("sync_schedules", "fire_schedules")


def test_a_scheduler_error_backs_off_the_scheduler_alone_and_claims_go_on(clock: Clock) -> None:
    queue = FakeQueue(clock)
    queue.schedules.append(FakeSchedule("m", every=60.0, due=1010.0))
    queue.failures["fire_schedules", None] = [psycopg.errors.DivisionByZero("bad")] * 3
    worker = scheduling_worker(queue, clock)
    queue.add(TASK, 3)

    run_for(worker, clock, 120)

    assert [j.state for j in queue.jobs.values()] == ["done"] * 3  # served meanwhile
    assert not worker.gate.waiting() and worker.scheduler.backoff.failures == 0
    assert len(queue.schedules[0].fired) == 2  # after its backoff, and at 1070


def test_a_worker_started_while_its_database_is_away_does_not_spin(clock: Clock) -> None:
    queue = FakeQueue(clock)
    queue.schedules.append(FakeSchedule("m", every=60.0, due=1010.0))
    queue.down_until = 1100.0  # from before the first heartbeat
    worker = scheduling_worker(queue, clock)

    assert run_for(worker, clock, 60) < 100  # it waits for the queue's backoff, not in a loop
    run_for(worker, clock, 60)
    assert len(queue.schedules[0].fired) == 1  # the missed ticks fire once, when it is back
