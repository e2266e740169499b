"""Periodic jobs against PostgreSQL, in-process: the sync of code schedules, one enqueue per
tick however many schedulers race for it, overlap, catch-up after a downtime (simulated by
moving next_run_at into the past), pause/resume/run now, the view and its index, the checks,
pruning. Schedulers here are plain psycopg connections in autocommit, as a worker's is."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_jobs import checks, queues
from django_jobs.exceptions import JobsError
from django_jobs.management.commands import runjobscheduler, runjobworker
from django_jobs.models import Job, Schedule, ScheduleTick
from django_jobs.prune import prune
from django_jobs.registry import registry
from django_jobs.schedules import declarations, ticks
from django_jobs.store import operations_views as stats
from testproject.testjobs.jobs import nightly
from tests.conftest import connect
from tests.factories import JobFactory, ScheduleFactory

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = registry.names()
REPORT = {"task": "tests.echo", "cron": "*/5 * * * *", "args": [1], "timezone": "Europe/Berlin"}


@pytest.fixture
def scheduler() -> Iterator[psycopg.Cursor[Any]]:
    """A scheduler's connection: its own, in autocommit."""
    conn = connect()
    try:
        yield conn.cursor()
    finally:
        conn.close()


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def overdue(name: str, by: str = "0 seconds") -> None:
    """The schedule's next tick, moved back to the whole minute at or before `now() - by` (a
    tick of an every minute schedule): the scheduler was away. With no `by`, that is the latest
    tick already due, so an every minute schedule has missed no other tick, whichever second
    of the minute the test runs in."""
    sql(
        "UPDATE django_jobs_schedule SET next_run_at = date_trunc('minute', now() - %s::interval)"
        " WHERE name = %s",
        [by, name],
    )


def admin_schedule(name: str, cron: str = "* * * * *", **fields: Any) -> Schedule:
    return ScheduleFactory(name=name, cron=cron, **fields)


def tick_count(name: str) -> int:
    return ScheduleTick.objects.filter(schedule__name=name).count()


# ---------------------------------------------------------------------- sync


def test_sync_adds_changes_and_marks_removed_code_schedules(scheduler) -> None:
    with override_settings(JOBS_SCHEDULES={"report": REPORT}):
        report = declarations.sync(scheduler)
    assert set(report.added) == {"report", "tests.nightly"} and report.in_sync is False
    row = Schedule.objects.get(name="report")
    assert (row.source, row.task, row.args, row.timezone) == (
        "code",
        "tests.echo",
        [1],
        REPORT["timezone"],
    )
    assert row.next_run_at is not None and row.next_run_at.minute % 5 == 0
    code = Schedule.objects.get(name="tests.nightly")
    assert (code.cron, code.next_run_at.hour) == ("0 4 29 2 *", 4)

    row.pause("ops")  # operators pause code schedules too
    first_next = row.next_run_at
    # Minute 7 of each hour: never a fire time of the old */5, whatever the clock says now.
    with override_settings(JOBS_SCHEDULES={"report": {**REPORT, "cron": "7 * * * *", "args": [2]}}):
        report = declarations.sync(scheduler)
        assert (report.added, report.changed, report.removed) == ([], ["report"], [])
        assert declarations.sync(scheduler).in_sync  # a second sync finds nothing to do
    row.refresh_from_db()
    assert (row.cron, row.args, row.paused, row.paused_by) == ("7 * * * *", [2], True, "ops")
    assert row.next_run_at != first_next and row.next_run_at.minute == 7

    with override_settings(JOBS_SCHEDULES={}):
        report = declarations.sync(scheduler)
    assert report.removed == ["report"]
    row.refresh_from_db()
    assert row.missing_from_code_since is not None
    overdue("report")
    row.resume()
    assert ticks.fire_due(scheduler, TASKS).fired == 0  # removed from code: it never fires

    with override_settings(JOBS_SCHEDULES={"report": REPORT}):
        assert declarations.sync(scheduler).changed == ["report"]  # back in code: it fires again
    row.refresh_from_db()
    assert row.missing_from_code_since is None and row.next_run_at is not None


def test_sync_leaves_admin_schedules_and_invalid_declarations_alone(scheduler) -> None:
    mine = admin_schedule("mine", "0 9 * * *")
    taken = admin_schedule("report", "0 10 * * *")
    bad = {"report": REPORT, "broken": {"task": "tests.echo", "cron": "0 25 * * *"}}
    with override_settings(JOBS_SCHEDULES=bad):
        report = declarations.sync(scheduler)
    assert report.conflicts == ["report"] and "broken" in report.errors
    assert "invalid cron expression '0 25 * * *'" in report.errors["broken"]
    assert not Schedule.objects.filter(name="broken").exists()  # nothing half-written
    for schedule in (mine, taken):
        before = schedule.updated_at
        schedule.refresh_from_db()
        assert (schedule.source, schedule.missing_from_code_since) == ("admin", None)
        assert schedule.updated_at == before


def test_syncschedules_prints_what_it_did_and_check_exits_1_when_out_of_sync(capsys) -> None:
    with override_settings(JOBS_SCHEDULES={"report": REPORT}):
        with pytest.raises(CommandError) as exited:
            call_command("syncschedules", "--check")
        assert exited.value.returncode == 1
        assert "would be added report" in capsys.readouterr().out
        assert not Schedule.objects.exists()
        call_command("syncschedules")
        out = capsys.readouterr().out
        assert "added report" in out and "schedules synced: 2 added" in out
        call_command("syncschedules", "--check")
        assert "in sync" in capsys.readouterr().out


# ---------------------------------------------------------------------- firing


def test_a_tick_enqueues_exactly_what_task_enqueue_would(scheduler) -> None:
    declarations.sync(scheduler)
    overdue("tests.nightly")
    done = ticks.fire_due(scheduler, TASKS)
    assert (done.fired, done.handled) == (1, 1) and done.seconds_until_due > 0
    schedule = Schedule.objects.get(name="tests.nightly")
    scheduled = Job.objects.get(pk=schedule.last_job_id)
    by_hand = nightly.enqueue()
    fields = ["task", "queue", "priority", "max_attempts", "timeout", "args", "kwargs", "state"]
    assert [getattr(scheduled, f) for f in fields] == [getattr(by_hand, f) for f in fields]
    assert (scheduled.queue, scheduled.priority, scheduled.timeout) == ("reports", 3, 600)
    assert scheduled.unique_key is None
    assert schedule.last_outcome == "enqueued" and schedule.last_run_at is not None
    tick = schedule.ticks.get()
    assert (tick.job_id, tick.outcome, tick.fire_at) == (
        scheduled.pk,
        "enqueued",
        schedule.last_run_at,
    )
    assert schedule.next_run_at > schedule.last_run_at
    # Nothing is due now: the next pass is one statement and does nothing.
    assert ticks.fire_due(scheduler, TASKS).handled == 0


@pytest.mark.parametrize("round_", range(3))
def test_two_schedulers_racing_for_one_tick_enqueue_it_once(round_: int) -> None:
    admin_schedule("race")
    overdue("race")
    start = threading.Barrier(2)
    results: list[ticks.FirePass] = []

    def run() -> None:
        conn = connect()
        try:
            start.wait()
            results.append(ticks.fire_due(conn.cursor(), TASKS))
        finally:
            conn.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.fired for r in results) == [0, 1]
    assert Job.objects.filter(task="tests.echo").count() == 1 and tick_count("race") == 1


def test_the_tick_constraint_refuses_a_tick_handled_already(scheduler) -> None:
    tick = late_daily("again", days=1, catch_up="latest").next_run_at
    assert ticks.fire_due(scheduler, TASKS).fired == 1
    # A scheduler that read next_run_at before the first one advanced it (or an edit that set
    # it back) comes to the same tick: the unique (schedule, fire_at) refuses it.
    sql("UPDATE django_jobs_schedule SET next_run_at = %s WHERE name = 'again'", [tick])
    done = ticks.fire_due(scheduler, TASKS)
    assert (done.fired, done.outcomes) == (0, ["again: already handled by another scheduler"])
    assert Job.objects.count() == 1 and tick_count("again") == 1
    assert Schedule.objects.get(name="again").last_outcome == "enqueued"


def test_overlap_skip_records_a_tick_while_the_previous_run_is_active(scheduler) -> None:
    schedule = admin_schedule("solo", overlap="skip")
    overdue("solo")
    ticks.fire_due(scheduler, TASKS)
    first = Job.objects.get()
    assert first.unique_key == "schedule:solo"

    sql("DELETE FROM django_jobs_schedule_tick")  # a later tick, while the first job is pending
    overdue("solo")
    assert ticks.fire_due(scheduler, TASKS).fired == 0
    schedule.refresh_from_db()
    assert schedule.last_outcome == "skipped: previous run active" and Job.objects.count() == 1
    assert schedule.ticks.get().outcome == "skipped: previous run active"
    assert schedule.last_job_id == first.pk

    sql("UPDATE django_jobs_job SET state = 'done', finished_at = now() WHERE id = %s", [first.pk])
    sql("DELETE FROM django_jobs_schedule_tick")
    overdue("solo")
    assert ticks.fire_due(scheduler, TASKS).fired == 1 and Job.objects.count() == 2


def late_daily(name: str = "daily", days: int = 4, **fields: Any) -> Schedule:
    """A daily schedule whose time of day is twelve hours from now, its next tick moved
    ``days`` days back: the scheduler was away for ``days - 1`` of its ticks and more."""
    hour = (int(sql("SELECT extract(hour FROM now())")[0][0]) + 12) % 24
    schedule = admin_schedule(name, f"0 {hour} * * *", **fields)
    sql(
        "UPDATE django_jobs_schedule SET next_run_at = next_run_at - %s * interval '1 day' "
        "WHERE name = %s",
        [days, name],
    )
    schedule.refresh_from_db()
    return schedule


def test_catch_up_skip_after_a_downtime_runs_nothing_and_says_so(scheduler) -> None:
    schedule = late_daily()
    before = schedule.next_run_at + timedelta(days=4)
    done = ticks.fire_due(scheduler, TASKS)
    assert done.fired == 0 and Job.objects.count() == 0
    schedule.refresh_from_db()
    assert schedule.last_outcome == "skipped 4 missed ticks"
    assert schedule.next_run_at == before and schedule.last_run_at is None


def test_catch_up_latest_after_a_downtime_runs_the_latest_tick_once(scheduler) -> None:
    schedule = late_daily(catch_up="latest")
    before = schedule.next_run_at + timedelta(days=4)
    done = ticks.fire_due(scheduler, TASKS)
    assert done.fired == 1 and Job.objects.count() == 1
    schedule.refresh_from_db()
    assert schedule.last_outcome == "enqueued (skipped 3 missed ticks)"
    assert schedule.last_run_at == before - timedelta(days=1)
    assert schedule.next_run_at == before
    assert ticks.fire_due(scheduler, TASKS).fired == 0  # no flood


def test_pause_resume_and_run_now(scheduler) -> None:
    schedule = admin_schedule("ops", "0 5 * * *", queue="imports", priority=7, args=["x"])
    schedule.pause("alice")
    assert (schedule.paused, schedule.paused_by) == (True, "alice") and schedule.paused_at
    overdue("ops", "3 days")
    assert ticks.next_due(scheduler, TASKS) is None
    assert ticks.fire_due(scheduler, TASKS).handled == 0

    schedule.resume()  # from the next tick after now: what was missed while paused is not run
    assert not schedule.paused and schedule.paused_at is None
    assert ticks.fire_due(scheduler, TASKS).handled == 0 and ticks.next_due(scheduler, TASKS) > 0

    next_run = schedule.next_run_at
    job = schedule.run_now()
    assert (job.task, job.queue, job.priority, job.args) == ("tests.echo", "imports", 7, ["x"])
    assert (schedule.last_job_id, schedule.last_outcome) == (job.pk, "run now")
    assert schedule.next_run_at == next_run and schedule.ticks.get().outcome == "run now"

    schedule.cron = "30 6 * * *"
    schedule.save()
    schedule.recompute_next_run()
    assert (schedule.next_run_at.hour, schedule.next_run_at.minute) == (6, 30)


def test_resuming_a_schedule_that_is_not_paused_keeps_its_due_tick(scheduler) -> None:
    # A resume clicked on a schedule that runs (a second operator, a stale page) has nothing
    # to resume; moving its next tick on from now would drop the tick due a moment ago.
    schedule = admin_schedule("running-along")
    overdue("running-along")
    due = Schedule.objects.get(name="running-along").next_run_at
    schedule.resume()
    assert schedule.next_run_at == due
    assert ticks.fire_due(scheduler, TASKS).fired == 1
    assert ScheduleTick.objects.get(schedule=schedule).fire_at == due


def test_each_operators_action_writes_its_own_fields_only(scheduler) -> None:
    schedule = admin_schedule("fields", "0 5 * * *", queue="imports", priority=7, args=["x"])
    job = schedule.run_now()
    before = Schedule.objects.values().get(pk=schedule.pk)

    def changed() -> dict[str, Any]:
        now = Schedule.objects.values().get(pk=schedule.pk)
        return {k: v for k, v in now.items() if v != before[k] and k != "updated_at"}

    schedule.pause("alice")
    assert set(changed()) == {"paused", "paused_at", "paused_by"}
    ticks.edit(schedule.pk, {"priority": 3, "args": ["y"]})
    assert set(changed()) == {"paused", "paused_at", "paused_by", "priority", "args"}
    schedule.resume()  # and its next tick after now, the same one here
    assert set(changed()) - {"next_run_at"} == {"priority", "args"}
    assert before["last_job_id"] == job.pk


def test_an_edit_of_the_time_keeps_a_tick_due_and_not_yet_fired(scheduler) -> None:
    schedule = admin_schedule("moved", "0 5 * * *")
    overdue("moved", "10 seconds")
    due = Schedule.objects.get(name="moved").next_run_at
    ticks.edit(schedule.pk, {"cron": "30 6 * * *"})
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.next_run_at) == ("30 6 * * *", due)
    assert ticks.fire_due(scheduler, TASKS).fired == 1  # the due tick fires, then the new times
    schedule.refresh_from_db()
    assert (schedule.next_run_at.hour, schedule.next_run_at.minute) == (6, 30)

    ticks.edit(schedule.pk, {"timezone": "Asia/Tokyo"})  # nothing due: from now, in Tokyo
    schedule.refresh_from_db()
    tokyo = schedule.next_run_at.astimezone(ZoneInfo("Asia/Tokyo"))
    assert (tokyo.hour, tokyo.minute) == (6, 30)
    with pytest.raises(JobsError, match="cannot edit paused"):
        ticks.edit(schedule.pk, {"paused": True})


def test_a_sync_that_moves_a_code_schedule_keeps_its_due_tick(scheduler) -> None:
    with override_settings(JOBS_SCHEDULES={"report": REPORT}):
        declarations.sync(scheduler)
    overdue("report")
    due = Schedule.objects.get(name="report").next_run_at
    with override_settings(JOBS_SCHEDULES={"report": {**REPORT, "cron": "7 * * * *"}}):
        assert declarations.sync(scheduler).changed == ["report"]
        assert Schedule.objects.get(name="report").next_run_at == due
        assert ticks.fire_due(scheduler, TASKS).fired == 1
    assert Schedule.objects.get(name="report").next_run_at.minute == 7


def _operate_in_a_loop(stop: Any, schedule_id: int) -> None:
    """An operator who edits and runs the schedule now, over and over."""
    connection.close()
    schedule = Schedule.objects.get(pk=schedule_id)
    crons = itertools.cycle(["0 5 1 1 *", "0 6 1 1 *"])
    while not stop.is_set():
        ticks.edit(schedule_id, {"cron": next(crons), "priority": 3})
        schedule.run_now()


def test_edits_and_runs_now_among_resumes_fire_no_tick_that_passed_while_paused() -> None:
    # A scheduler process fires due ticks in a tight loop, a second process edits the paused
    # schedule and runs it now, and the operator here pauses it, moves its tick into the past
    # and resumes it, 100 times: no tick of the schedule's times ever fires, only runs now.
    schedule = admin_schedule("busy", "0 5 1 1 *", catch_up="latest")
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    connection.close()  # the children get none of this process's connections
    children = [
        context.Process(target=_fire_in_a_loop, args=(stop,)),
        context.Process(target=_operate_in_a_loop, args=(stop, schedule.pk)),
    ]
    for child in children:
        child.start()
    try:
        for _ in range(100):
            schedule.pause("ops")
            overdue("busy", "3 days")
            schedule.resume()
    finally:
        stop.set()
        for child in children:
            child.join(timeout=30)
    assert [child.exitcode for child in children] == [0, 0]
    outcomes = set(ScheduleTick.objects.filter(schedule=schedule).values_list("outcome", flat=True))
    assert outcomes <= {"run now", "skipped: previous run active"}
    assert Job.objects.count() == ScheduleTick.objects.filter(outcome="run now").count() > 0


# ---------------------------------------------------------------------- a paused queue


def test_ticks_for_a_paused_queue_are_skipped_and_say_so(scheduler) -> None:
    names = ["into-paused-1", "into-paused-2", "into-paused-3"]
    for name in names:
        admin_schedule(name, queue="imports")
        overdue(name)
    JobFactory(task="tests.noop", queue="imports")  # the queue is known
    queues.pause("imports", by="ops")
    before = {s.name: s.next_run_at for s in Schedule.objects.all()}
    done = ticks.fire_due(scheduler, TASKS)
    assert (done.fired, done.handled) == (0, 3)
    assert Job.objects.filter(task="tests.echo").count() == 0
    rows = ScheduleTick.objects.values_list("schedule__name", "outcome", "job_id")
    assert sorted(rows) == [(name, "skipped: queue paused", None) for name in names]
    for schedule in Schedule.objects.all():  # each goes on to its next tick: nothing piles up
        assert schedule.last_outcome == "skipped: queue paused"
        assert schedule.next_run_at > before[schedule.name]

    job = Schedule.objects.get(name=names[0]).run_now()  # an operator's run now still enqueues
    assert job.queue == "imports" and job.state == "pending"

    queues.resume("imports")
    admin_schedule("after-resume", queue="imports")
    overdue("after-resume")
    assert ticks.fire_due(scheduler, TASKS).fired == 1
    assert Job.objects.filter(task="tests.echo").count() == 2  # the run now, and this tick's


def test_a_schedule_may_enqueue_into_a_paused_queue(scheduler) -> None:
    schedule = admin_schedule("enqueues", queue="imports", when_queue_paused="enqueue")
    JobFactory(task="tests.noop", queue="imports")
    queues.pause("imports", by="ops")
    overdue("enqueues")
    assert ticks.fire_due(scheduler, TASKS).fired == 1
    assert Job.objects.get(task="tests.echo").queue == "imports"
    assert ScheduleTick.objects.get(schedule=schedule).outcome == "enqueued"


def test_when_queue_paused_is_declared_in_code_and_checked(scheduler) -> None:
    spec = {**REPORT, "when_queue_paused": "enqueue"}
    with override_settings(JOBS_SCHEDULES={"report": spec}):
        assert declarations.sync(scheduler).added
    assert Schedule.objects.get(name="report").when_queue_paused == "enqueue"
    with override_settings(JOBS_SCHEDULES={"report": REPORT}):
        assert declarations.sync(scheduler).changed == ["report"]
    assert Schedule.objects.get(name="report").when_queue_paused == "skip"
    with override_settings(JOBS_SCHEDULES={"report": {**REPORT, "when_queue_paused": "wait"}}):
        report = declarations.sync(scheduler)
    assert "when_queue_paused must be 'skip' or 'enqueue', not 'wait'" in report.errors["report"]


def test_run_now_with_overlap_skip_hands_back_the_active_run(scheduler) -> None:
    schedule = admin_schedule("solo-now", overlap="skip")
    first = schedule.run_now()
    assert schedule.run_now().pk == first.pk and Job.objects.count() == 1
    assert schedule.last_outcome == "skipped: previous run active"


# ---------------------------------------------------------------------- visible, checked, pruned


def test_the_view_shows_lateness_and_a_scheduler_with_nothing_due_reads_one_index() -> None:
    admin_schedule("late-one")
    overdue("late-one", "90 seconds")
    admin_schedule("paused-one").pause("bob")
    overdue("paused-one", "1 hour")
    rows = sql(
        "SELECT name, expression, paused, removed_from_code, late_seconds, last_outcome "
        "FROM django_jobs_schedules ORDER BY name"
    )
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("late-one", False, False),
        ("paused-one", True, False),
    ]
    assert 89 < rows[0][4] < 151 and rows[1][4] == 0  # 90 s, back to a whole minute

    sql(
        "INSERT INTO django_jobs_schedule (name, task, cron, timezone, args, kwargs, queue, "
        "catch_up, overlap, paused, paused_by, source, next_run_at, last_outcome, created_at, "
        "updated_at) SELECT 'bulk-' || i, 'tests.echo', '@daily', 'UTC', '[]', '{}', '', 'skip', "
        "'allow', i %% 3 = 0, '', 'admin', now() + i * interval '1 minute', '', now(), now() "
        "FROM generate_series(1, 5000) i",
        [],
    )
    sql("DELETE FROM django_jobs_schedule WHERE name IN ('late-one', 'paused-one')")
    sql("ANALYZE django_jobs_schedule")
    with connection.cursor() as cursor:
        text = ticks.query("next_due").replace("%(tasks)s", "%s")
        cursor.execute("EXPLAIN " + text, [TASKS])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "schedule_due_idx" in plan, plan


def test_bad_declarations_are_system_check_errors() -> None:
    bad = {
        "a": {"task": "tests.echo", "cron": "0 3 * *"},
        "b": {"task": "tests.echo", "cron": "@daily", "timezone": "Berlin/Mitte"},
        "c": {"task": "nope.missing", "cron": "@daily"},
        "d": {"task": "tests.echo", "cron": "@daily", "args": [{1, 2}]},
    }
    with override_settings(JOBS_SCHEDULES=bad):
        errors = checks.check_schedules()
    assert [e.id for e in errors] == ["django_jobs.E004"] * 4
    text = "\n".join(e.msg for e in errors)
    for part in (
        "has 4 field(s)",
        "unknown timezone 'Berlin/Mitte'",
        "task 'nope.missing' is not registered",
        "args[0] is a set, which is not JSON",
    ):
        assert part in text
    assert checks.check_schedules() == []
    # manage.py check reports them; a worker or a scheduler starts anyway, and logs them.
    for command in (runjobworker.Command, runjobscheduler.Command):
        assert checks.SCHEDULES not in command.requires_system_checks
        assert {"database", "models"} <= set(command.requires_system_checks)


def test_prune_deletes_old_tick_records_and_jobstats_lists_schedules(scheduler) -> None:
    admin_schedule("pruned")
    overdue("pruned")
    ticks.fire_due(scheduler, TASKS)
    sql("UPDATE django_jobs_schedule_tick SET created_at = now() - interval '30 days'")
    assert prune(older_than=timedelta(days=14), dry_run=True).ticks == 1
    result = prune(older_than=timedelta(days=14))
    assert result.ticks == 1 and "1 schedule tick record(s)" in result.summary()
    assert not ScheduleTick.objects.exists()

    summary = stats.summary()
    assert [s["name"] for s in summary["schedules"]] == ["pruned"]
    assert "schedules · 1 (0 paused" in stats.render(summary)


def _fire_in_a_loop(stop: Any) -> None:
    conn = connect()
    try:
        cursor = conn.cursor()
        while not stop.is_set():
            ticks.fire_due(cursor, TASKS)
    finally:
        conn.close()


def test_a_resume_never_fires_a_tick_that_passed_while_paused() -> None:
    # A scheduler process fires due ticks in a tight loop while an operator resumes a schedule,
    # paused with its next tick long past, 100 times. A resume that clears `paused` before it
    # moves `next_run_at` on lets the scheduler see the passed tick in between, and fire it.
    schedule = admin_schedule("resumed", "0 5 1 1 *", catch_up="latest")  # next tick: January
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    scheduler = context.Process(target=_fire_in_a_loop, args=(stop,))
    connection.close()  # the child gets none of this process's connections
    scheduler.start()
    try:
        for _ in range(100):
            schedule.pause("ops")
            overdue("resumed", "3 days")
            schedule.resume()
    finally:
        stop.set()
        scheduler.join(timeout=30)
    assert scheduler.exitcode == 0
    assert tick_count("resumed") == 0
