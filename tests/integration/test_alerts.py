"""The ``django_jobs_alerts`` view: each kind of alert fires in its scenario, with its severity,
and clears when the cause is gone; its thresholds reach it from the settings and the registry;
its plan reads indexes only. Times are the database's: a test runs in one transaction, whose
``now()`` the view compares with, and every row is made relative to it."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_jobs import alerts, job
from django_jobs.models import AlertThreshold, Job, Rollup, Schedule, ScheduleTick
from support.history import fill_history
from tests.conftest import ROOT
from tests.factories import AttemptFactory, JobFactory, WorkerFactory
from tests.integration.helpers import read_only_role_sql

pytestmark = pytest.mark.django_db


@job(name="tests.alerts.expected", expected_duration=60)
def expected_task() -> None: ...


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def firing(kind: str | None = None) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM django_jobs_alerts ORDER BY kind, subject")
        names = [c[0] for c in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return [row for row in rows if kind is None or row["kind"] == kind]


def subjects(kind: str) -> dict[str, str]:
    """The firing subjects of ``kind``, with their severity."""
    return {row["subject"]: row["severity"] for row in firing(kind)}


@pytest.fixture
def now() -> datetime:
    return db_now()


@pytest.fixture
def live_worker(now: datetime) -> Any:
    """A live worker of every queue, so that ready jobs do not also fire queue_no_worker."""
    return WorkerFactory(id="alive:1:aaaaaa", last_seen_at=now)


# ------------------------------------------------------------------------------- schedules


def schedule(now: datetime, name: str = "nightly", **fields: Any) -> Schedule:
    fields.setdefault("next_run_at", now + timedelta(hours=20))
    return Schedule.objects.create(
        name=name, task="tests.echo", cron="0 3 * * *", source="code", **fields
    )


def tick(
    s: Schedule, at: datetime, state: str | None, outcome: str = "enqueued", runs: float = 60
) -> ScheduleTick:
    """A tick fired at ``at`` whose job is in ``state`` (None: the tick enqueued nothing)."""
    job_id = None
    if state is not None:
        ended = at + timedelta(seconds=runs)
        job_id = JobFactory(
            task=s.task,
            state=state,
            attempt=1,
            started_at=at,
            finished_at=ended if state in ("done", "error", "cancelled") else None,
            worker_id="w:1:abcdef" if state == "running" else None,
        ).pk
    return ScheduleTick.objects.create(schedule=s, fire_at=at, job_id=job_id, outcome=outcome)


def test_a_schedule_whose_runs_fail_fires_until_one_succeeds(now: datetime) -> None:
    nightly = schedule(now)
    success = tick(nightly, now - timedelta(hours=28), "done")
    tick(nightly, now - timedelta(hours=4), "error")
    (row,) = firing("schedule_missed")
    assert (row["subject"], row["severity"], row["task"]) == ("nightly", "warning", "tests.echo")
    # Due at the failed tick, which had the default grace of 600 s to succeed.
    assert row["since"] == now - timedelta(hours=4) + timedelta(seconds=600)
    assert row["value"] == pytest.approx(4 * 3600) and row["threshold"] == 600
    assert row["job_id"] == success.job_id
    assert "last successful run: the tick of" in row["detail"]
    assert "1 tick(s) since, none succeeded" in row["detail"]

    # A second failed run in a row is critical.
    tick(nightly, now - timedelta(hours=2), "error")
    assert subjects("schedule_missed") == {"nightly": "critical"}

    # An operator's "run now" that succeeds clears it until the next tick is due.
    tick(nightly, now - timedelta(minutes=30), "done", outcome="run now")
    assert firing("schedule_missed") == []


def test_a_schedule_run_gets_its_grace_and_a_schedule_without_runs_waits_for_its_first(
    now: datetime,
) -> None:
    nightly = schedule(now)
    tick(nightly, now - timedelta(minutes=5), "running")  # within the 600 s grace
    schedule(now, name="new")  # no tick yet, the first one ahead
    assert firing("schedule_missed") == []
    tick(nightly, now - timedelta(minutes=1), "pending", outcome="run now")
    assert firing("schedule_missed") == []


def test_a_schedule_that_never_succeeded_fires_from_its_first_tick(now: datetime) -> None:
    nightly = schedule(now)
    tick(nightly, now - timedelta(hours=3), "error")
    (row,) = firing("schedule_missed")
    assert row["since"] == now - timedelta(hours=3) + timedelta(seconds=600)
    assert row["detail"].startswith("no successful run yet")
    assert row["job_id"] is None


def test_a_schedule_no_scheduler_fires_is_critical(now: datetime) -> None:
    nightly = schedule(now, next_run_at=now - timedelta(hours=1))
    tick(nightly, now - timedelta(hours=25), "done")
    (row,) = firing("schedule_missed")
    assert row["severity"] == "critical"
    assert row["since"] == now - timedelta(hours=1) + timedelta(seconds=600)
    assert "was not fired: no scheduler runs with its task registered" in row["detail"]


def test_a_tick_skipped_while_the_last_success_still_ran_is_not_a_miss(now: datetime) -> None:
    hourly = schedule(now, name="hourly", overlap="skip")
    tick(hourly, now - timedelta(hours=2), "done", runs=90 * 60)  # ended 30 minutes ago
    tick(hourly, now - timedelta(hours=1), None, outcome="skipped: previous run active")
    assert firing("schedule_missed") == []
    # A tick skipped after it ended is one: another run of the schedule held the key.
    tick(hourly, now - timedelta(minutes=20), None, outcome="skipped: previous run active")
    assert subjects("schedule_missed") == {"hourly": "warning"}


def test_paused_and_removed_schedules_do_not_fire(now: datetime) -> None:
    for name, fields in [("paused", {"paused": True}), ("gone", {"missing_from_code_since": now})]:
        s = schedule(now, name=name, **fields)
        tick(s, now - timedelta(hours=4), "error")
    assert firing("schedule_missed") == []


def test_a_schedules_grace_comes_from_the_setting(now: datetime) -> None:
    nightly = schedule(now)
    tick(nightly, now - timedelta(hours=4), "error")
    schedule(now, name="other", next_run_at=now - timedelta(minutes=20))
    with override_settings(JOBS_ALERTS={"schedule_grace": {"*": "30m", "nightly": "5h"}}):
        alerts.sync_thresholds()
    assert subjects("schedule_missed") == {}
    with override_settings(JOBS_ALERTS={"schedule_grace": {"*": "10m", "nightly": None}}):
        alerts.sync_thresholds()
    assert subjects("schedule_missed") == {"other": "critical"}


# ----------------------------------------------------------------------------- overdue jobs


def running(task: str, seconds: float, now: datetime, queue: str = "default") -> Job:
    return JobFactory(
        task=task,
        queue=queue,
        claimed=True,
        worker_id="alive:1:aaaaaa",
        started_at=now - timedelta(seconds=seconds),
    )


def test_a_job_past_its_tasks_expected_duration_fires(now: datetime) -> None:
    alerts.sync_thresholds()  # writes @job(expected_duration=60) of tests.alerts.expected
    assert AlertThreshold.objects.get(kind="expected_duration", subject=expected_task.name)
    on_time = running(expected_task.name, 50, now)
    late = running(expected_task.name, 90, now)
    very_late = running(expected_task.name, 150, now)
    assert subjects("job_overdue") == {str(late.pk): "warning", str(very_late.pk): "critical"}
    (row,) = [r for r in firing("job_overdue") if r["job_id"] == late.pk]
    assert row["since"] == late.started_at + timedelta(seconds=60)
    assert (row["value"], row["threshold"]) == (pytest.approx(90), 60)
    assert (row["task"], row["queue"]) == (expected_task.name, "default")
    assert "expected at most 60 s (its expected_duration)" in row["detail"]
    assert str(on_time.pk) not in subjects("job_overdue")

    # It finishes: gone.
    Job.objects.filter(pk__in=[late.pk, very_late.pk]).update(
        state="done", finished_at=now, worker_id=None
    )
    assert firing("job_overdue") == []


def test_the_setting_overrides_a_tasks_expected_duration_or_turns_it_off(now: datetime) -> None:
    job_ = running(expected_task.name, 90, now)
    with override_settings(JOBS_ALERTS={"expected_duration": {expected_task.name: "2m"}}):
        alerts.sync_thresholds()
    assert firing("job_overdue") == []
    with override_settings(JOBS_ALERTS={"expected_duration": {expected_task.name: "1m"}}):
        alerts.sync_thresholds()
    assert list(subjects("job_overdue")) == [str(job_.pk)]
    with override_settings(JOBS_ALERTS={"expected_duration": {expected_task.name: None}}):
        alerts.sync_thresholds()
    assert firing("job_overdue") == []


def past_runs(task: str, count: int, seconds: float, now: datetime) -> None:
    for i in range(count):
        end = now - timedelta(hours=1, minutes=i)
        JobFactory(
            task=task,
            finished=True,
            started_at=end - timedelta(seconds=seconds),
            finished_at=end,
        )


def test_without_an_expected_duration_a_job_far_past_its_tasks_p95_fires(now: datetime) -> None:
    past_runs("tests.alerts.p95", 30, 200, now)  # p95 200 s: overdue past 3 x 200 s
    fine = running("tests.alerts.p95", 500, now)
    late = running("tests.alerts.p95", 700, now)
    (row,) = firing("job_overdue")
    assert (row["subject"], row["severity"]) == (str(late.pk), "warning")
    assert row["threshold"] == pytest.approx(600)
    assert "3 x the p95 of 200 s over the last 30 successful runs" in row["detail"]
    assert "at least 300 s" in row["detail"]
    assert fine.pk != late.pk

    # A short task's floor is the minimum, 300 s.
    past_runs("tests.alerts.quick", 25, 2, now)
    quick = running("tests.alerts.quick", 301, now)
    by_job = {row["job_id"]: row for row in firing("job_overdue")}
    assert (by_job[quick.pk]["severity"], by_job[quick.pk]["threshold"]) == ("warning", 300)


def test_the_p95_comes_from_the_rollups_once_they_hold_enough_runs(now: datetime) -> None:
    from django_jobs import rollups

    for i in range(30):  # two days ago: rolled up, then pruned
        end = now - timedelta(days=2, minutes=i)
        job_ = JobFactory(
            task="tests.alerts.rolled", finished=True,
            started_at=end - timedelta(seconds=200), finished_at=end,
        )  # fmt: skip
        AttemptFactory(
            job=job_, outcome="done", started_at=end - timedelta(seconds=200), finished_at=end
        )
    rollups.roll_up()
    Job.objects.filter(task="tests.alerts.rolled").delete()
    # 200 s falls in the bucket [120 s, 300 s): its p95 is 120 + 180 x 0.95 = 291 s.
    fine = running("tests.alerts.rolled", 800, now)
    late = running("tests.alerts.rolled", 900, now)
    (row,) = firing("job_overdue")
    assert row["subject"] == str(late.pk) and fine.pk != late.pk
    assert row["threshold"] == pytest.approx(3 * 291)
    assert (
        "the p95 of 291 s over the 30 successful runs of its task in the last 7 days"
        in (row["detail"])
    )
    # Without the rollups' rows, the task's newest jobs decide, and there are none left.
    Rollup.objects.all().delete()
    assert firing("job_overdue") == []


def test_a_task_without_enough_history_is_not_judged_by_its_p95(now: datetime) -> None:
    past_runs("tests.alerts.rare", 19, 2, now)  # fewer than 20 successful runs
    running("tests.alerts.rare", 3600, now)
    assert firing("job_overdue") == []
    with override_settings(JOBS_ALERTS={"overdue": {"p95_factor": 2, "min_seconds": "30m"}}):
        alerts.sync_thresholds()
    past_runs("tests.alerts.rare", 1, 2, now)  # now 20
    assert len(firing("job_overdue")) == 1
    with override_settings(JOBS_ALERTS={"overdue": None}):
        alerts.sync_thresholds()
    assert firing("job_overdue") == []


# ----------------------------------------------------------------------------------- queues


def test_a_queue_whose_oldest_ready_job_is_too_old_fires(now: datetime, live_worker) -> None:
    JobFactory(queue="emails", run_after=now - timedelta(minutes=5))  # within 600 s
    JobFactory(queue="emails", run_after=now + timedelta(hours=1))  # scheduled, not ready
    assert firing("queue_age") == []
    # The oldest in another priority than the first in claim order is found too.
    JobFactory(queue="emails", priority=50, run_after=now - timedelta(minutes=1))
    oldest = JobFactory(queue="emails", priority=-10, run_after=now - timedelta(minutes=11))
    (row,) = firing("queue_age")
    assert (row["subject"], row["severity"], row["queue"]) == ("emails", "warning", "emails")
    assert row["job_id"] == oldest.pk
    assert row["since"] == oldest.run_after + timedelta(seconds=600)
    assert row["value"] == pytest.approx(660) and row["threshold"] == 600
    assert f"the oldest ready job ({oldest.pk}) has waited 660 s" in row["detail"]

    JobFactory(queue="emails", run_after=now - timedelta(minutes=25))
    assert subjects("queue_age") == {"emails": "critical"}  # twice the threshold


def test_a_queue_age_alert_clears_when_the_job_is_claimed(now: datetime, live_worker) -> None:
    old = JobFactory(queue="emails", run_after=now - timedelta(minutes=2))
    with override_settings(JOBS_ALERTS={"queue_age": {"*": 600, "emails": 60}}):
        alerts.sync_thresholds()
    assert subjects("queue_age") == {"emails": "warning"}
    Job.objects.filter(pk=old.pk).update(
        state="running", worker_id=live_worker.id, attempt=1, started_at=now
    )
    assert firing("queue_age") == []


def test_a_paused_queue_and_a_queue_turned_off_do_not_fire(now: datetime, live_worker) -> None:
    from django_jobs.models import Queue

    for queue in ("paused", "batch", "default"):
        JobFactory(queue=queue, run_after=now - timedelta(hours=1))
    Queue.objects.create(name="paused", paused=True)
    with override_settings(JOBS_ALERTS={"queue_age": {"batch": None}, "no_worker": None}):
        alerts.sync_thresholds()
    assert subjects("queue_age") == {"default": "critical"}
    live_worker.delete()
    assert firing("queue_no_worker") == []


def test_a_queue_with_ready_jobs_and_no_live_worker_fires(now: datetime) -> None:
    ready = JobFactory(queue="reports", run_after=now - timedelta(minutes=5))
    JobFactory(queue="soon", run_after=now - timedelta(seconds=30))  # within the 60 s grace
    other = WorkerFactory(queues=["default"], last_seen_at=now)
    stale = WorkerFactory(queues=["reports"], last_seen_at=now - timedelta(minutes=3))
    (row,) = firing("queue_no_worker")
    assert (row["subject"], row["severity"], row["job_id"]) == ("reports", "critical", ready.pk)
    # Since the stale worker counted as gone (60 s after its last heartbeat), plus the grace.
    assert row["since"] == stale.last_seen_at + timedelta(seconds=60 + 60)
    assert "no live worker serves the queue; the last one was seen at" in row["detail"]
    assert other.queues == ["default"]

    # Its heartbeat comes back: cleared.
    stale.last_seen_at = now
    stale.save(update_fields=["last_seen_at"])
    assert firing("queue_no_worker") == []
    # A worker of every queue serves it too.
    stale.delete()
    assert len(firing("queue_no_worker")) == 1
    WorkerFactory(queues=[], last_seen_at=now - timedelta(seconds=10))
    assert firing("queue_no_worker") == []


def test_no_worker_follows_the_worker_timeout_session_setting(now: datetime) -> None:
    JobFactory(queue="reports", run_after=now - timedelta(minutes=5))
    WorkerFactory(queues=["reports"], last_seen_at=now - timedelta(minutes=3))
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('django_jobs.worker_timeout', '600', true)")
    assert firing("queue_no_worker") == []


# -------------------------------------------------------------------------- used-up attempts


def exhausted(task: str, count: int, minutes_ago: float, now: datetime, **job: Any) -> None:
    for _ in range(count):
        end = now - timedelta(minutes=minutes_ago)
        values = {"state": "error", "attempt": 3, "max_attempts": 3, "finished_at": end, **job}
        row = JobFactory(task=task, started_at=end, **values)
        AttemptFactory(
            job=row, number=row.attempt, outcome="error", started_at=end, finished_at=end
        )


def test_jobs_that_used_up_their_attempts_fire_per_task(now: datetime) -> None:
    exhausted("tests.fail", 4, 10, now)
    # Not counted: a failed attempt that was retried, and jobs of the window before.
    exhausted("tests.fail", 3, 10, now, state="pending", attempt=1, finished_at=None)
    exhausted("tests.fail", 6, 90, now)
    assert firing("attempts_exhausted") == []
    exhausted("tests.fail", 1, 5, now)
    (row,) = firing("attempts_exhausted")
    assert (row["subject"], row["task"], row["severity"]) == ("tests.fail", "tests.fail", "warning")
    assert (row["value"], row["threshold"]) == (5, 5)
    assert row["since"] == now - timedelta(minutes=10)
    assert row["detail"] == (
        "5 job(s) used up their attempts in the last 3600 s (6 in the 3600 s before); threshold 5"
    )
    # Twice the threshold, and more than the window before: critical.
    exhausted("tests.fail", 5, 1, now)
    assert subjects("attempts_exhausted") == {"tests.fail": "critical"}


def test_used_up_attempts_clear_once_out_of_the_window(now: datetime) -> None:
    exhausted("tests.fail", 5, 10, now)
    assert len(firing("attempts_exhausted")) == 1
    with override_settings(JOBS_ALERTS={"exhausted": {"threshold": 5, "window": "5m"}}):
        alerts.sync_thresholds()
    assert firing("attempts_exhausted") == []
    with override_settings(JOBS_ALERTS={"exhausted": None}):
        alerts.sync_thresholds()
    exhausted("tests.fail", 5, 1, now)
    assert firing("attempts_exhausted") == []


# ------------------------------------------------------------------------------ thresholds


def stored() -> dict[tuple[str, str], float]:
    return {(t.kind, t.subject): t.value for t in AlertThreshold.objects.all()}


def test_a_sync_writes_the_settings_and_the_registry_and_only_what_changed() -> None:
    with override_settings(JOBS_ALERTS={"queue_age": {"emails": 60}, "no_worker": None}):
        first = alerts.sync_thresholds()
        again = alerts.sync_thresholds()
    rows = stored()
    assert rows["queue_age", "emails"] == 60 and rows["queue_age", "*"] == 600
    assert rows["no_worker", "*"] == float("inf")
    assert rows["expected_duration", expected_task.name] == 60
    assert rows["exhausted_threshold", "*"] == 5
    assert first is not None and first.written == len(rows) and first.removed == 0
    assert again == (0, 0)
    with override_settings(JOBS_ALERTS={"queue_age": 120}):
        changed = alerts.sync_thresholds()
    assert changed == (2, 1)  # queue_age * and no_worker * written, queue_age emails removed
    assert ("queue_age", "emails") not in stored()


def test_an_invalid_setting_is_logged_and_writes_nothing(caplog) -> None:
    with override_settings(JOBS_ALERTS={"queue_age": -1}):
        assert alerts.sync_thresholds() is None
    assert "alert thresholds not synced: JOBS_ALERTS['queue_age']" in caplog.text
    assert not AlertThreshold.objects.exists()


def test_without_thresholds_the_view_uses_the_defaults(now: datetime, live_worker) -> None:
    JobFactory(queue="default", run_after=now - timedelta(seconds=601))
    assert [(r["kind"], r["threshold"]) for r in firing()] == [("queue_age", 600)]


def test_syncschedules_writes_the_alert_thresholds_too(capsys) -> None:
    call_command("syncschedules")
    out = capsys.readouterr().out
    assert re.search(r"^alert thresholds synced: \d+ written, 0 removed$", out, re.M), out
    assert stored()["schedule_grace", "*"] == 600
    call_command("syncschedules")
    assert "alert thresholds synced: 0 written, 0 removed" in capsys.readouterr().out
    call_command("syncschedules", "--check")
    assert "alert thresholds" not in capsys.readouterr().out  # --check changes nothing


@pytest.mark.django_db(transaction=True)
def test_a_worker_and_a_scheduler_sync_the_thresholds_on_their_connection() -> None:
    from django_jobs.store.connection import QueueConnection
    from django_jobs.worker.duties import PostgresDuties

    connection_ = QueueConnection("default", "test-alerts")
    try:
        duties = PostgresDuties(connection_)
        with override_settings(JOBS_ALERTS={"queue_age": {"emails": 30}}):
            duties.sync_alert_thresholds()
        assert stored()["queue_age", "emails"] == 30
        with override_settings(JOBS_ALERTS={"queue_age": {"emails": 45}}):
            duties.sync_schedules()
        assert stored()["queue_age", "emails"] == 45
    finally:
        connection_.close()


# ----------------------------------------------------------------------------------- checks


def test_bad_alert_settings_are_system_check_errors() -> None:
    from django_jobs.checks import check_alerts

    assert check_alerts() == []
    for setting, message in [
        ({"queue_age": {"emails": -60}}, "JOBS_ALERTS['queue_age']['emails']: a duration cannot"),
        ({"schedule_grace": "soon"}, "JOBS_ALERTS['schedule_grace']: expected a duration"),
        ({"exhausted": {"threshold": 0}}, "'threshold'] must be a whole number of jobs from 1"),
        ({"overdue": {"p95_factor": 0.5}}, "'p95_factor'] must be a number from 1"),
        ({"queue_ages": 60}, "JOBS_ALERTS has unknown keys ['queue_ages']"),
        ({"expected_duration": {"tests.echo": 0}}, "must be longer than 0 seconds"),
    ]:
        with override_settings(JOBS_ALERTS=setting):
            (error,) = check_alerts()
        assert error.id == "django_jobs.E006", setting
        assert message in error.msg, (setting, error.msg)


def test_an_unknown_task_in_expected_duration_is_a_system_check_error() -> None:
    from django_jobs.checks import check_alerts

    with override_settings(JOBS_ALERTS={"expected_duration": {"tests.echo": 60, "tests.ehco": 60}}):
        (error,) = check_alerts()
    assert error.id == "django_jobs.E007"
    assert "names the task 'tests.ehco', which is not registered" in error.msg


# ---------------------------------------------------------------------------- the command


def jobsalerts(*args: str) -> tuple[int, str]:
    """Run ``manage.py jobsalerts``: its exit code and what it printed."""
    out = io.StringIO()
    try:
        call_command("jobsalerts", *args, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue()
    return 0, out.getvalue()


def test_jobsalerts_prints_nothing_firing_and_exits_0(now: datetime, live_worker) -> None:
    JobFactory(queue="default", run_after=now - timedelta(minutes=1))
    assert jobsalerts() == (0, "no alerts firing\n")
    assert AlertThreshold.objects.filter(kind="queue_age").exists()  # it synced first


def test_jobsalerts_prints_each_alert_and_exits_1_while_any_fires(now: datetime) -> None:
    ready = JobFactory(queue="emails", run_after=now - timedelta(minutes=25))
    WorkerFactory(queues=["emails"], last_seen_at=now)
    late = running(expected_task.name, 90, now, queue="emails")
    code, out = jobsalerts()
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("CRITICAL queue_age          emails  since ")
    assert f"the oldest ready job ({ready.pk}) has waited 1500 s, more than 600 s" in lines[1]
    assert lines[2].startswith(f"WARNING  job_overdue        {late.pk}  since ")
    assert lines[2].endswith("(30s)")  # since it passed its 60 s
    assert "expected at most 60 s (its expected_duration)" in lines[3]
    assert len(lines) == 4

    # Only the critical ones.
    code, out = jobsalerts("--severity", "critical")
    assert code == 1 and len(out.splitlines()) == 2
    # Cleared: exit 0.
    Job.objects.filter(pk=late.pk).update(state="done", finished_at=now, worker_id=None)
    Job.objects.filter(pk=ready.pk).update(run_after=now)
    assert jobsalerts() == (0, "no alerts firing\n")


def test_jobsalerts_json_is_the_views_rows(now: datetime) -> None:
    JobFactory(queue="reports", run_after=now - timedelta(minutes=5))
    code, out = jobsalerts("--json")
    assert code == 1
    data = json.loads(out)
    assert datetime.fromisoformat(data["generated_at"]) == now
    (alert,) = data["alerts"]
    assert set(alert) == {
        "kind", "subject", "since", "detail", "severity", "queue", "task", "job_id", "value",
        "threshold",
    }  # fmt: skip
    assert (alert["kind"], alert["subject"], alert["severity"]) == (
        "queue_no_worker",
        "reports",
        "critical",
    )
    assert datetime.fromisoformat(alert["since"]) == now - timedelta(minutes=4)
    assert jobsalerts("--json", "--severity", "critical")[0] == 1


def test_jobsalerts_without_sync_writes_no_threshold(now: datetime, live_worker) -> None:
    assert jobsalerts("--no-sync") == (0, "no alerts firing\n")
    assert not AlertThreshold.objects.exists()


def test_jobsalerts_with_a_bad_setting_fails_its_check_and_exits_2() -> None:
    from django.core.management.base import SystemCheckError

    with (
        override_settings(JOBS_ALERTS={"queue_age": -1}),
        pytest.raises(SystemCheckError, match=r"django_jobs\.E006") as failed,
    ):
        call_command("jobsalerts", skip_checks=False, stdout=io.StringIO())
    assert failed.value.returncode == 2
    assert not AlertThreshold.objects.exists()


def manage_jobsalerts(env: dict[str, str], url: str) -> tuple[int, str, str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "jobsalerts"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    return result.returncode, line, result.stdout


def test_jobsalerts_exits_2_with_one_line_when_the_database_is_away(worker_env) -> None:
    code, line, out = manage_jobsalerts(worker_env, "postgres://postgres@127.0.0.1:1/nothing")
    assert code == 2 and out == ""
    assert line.startswith("CommandError: the database 'default' at 127.0.0.1:1/nothing is ")
    assert "unreachable" in line


def test_jobsalerts_exits_2_with_one_line_when_the_tables_are_missing(worker_env) -> None:
    from tests.conftest import connect

    with connect() as conn:
        name = f"{conn.info.dbname}_alerts_empty"
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url, _, options = worker_env["DATABASE_URL"].partition("?")
        url = url.rsplit("/", 1)[0] + f"/{name}" + (f"?{options}" if options else "")
        code, line, out = manage_jobsalerts(worker_env, url)
    finally:
        with connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert code == 2 and out == ""
    assert "django_jobs migration(s) not applied" in line
    assert line.endswith("run `python manage.py migrate`")


def test_each_grafana_alert_rule_reads_its_kind_from_the_view(now: datetime) -> None:
    import yaml

    JobFactory(queue="reports", run_after=now - timedelta(minutes=25))
    path = ROOT / "grafana" / "provisioning" / "alerting" / "django-jobs-alerts.yaml"
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    found = {}
    for rule in rules:
        (query,) = [q for q in rule["data"] if q["refId"] == "A"]
        with connection.cursor() as cursor:
            cursor.execute(query["model"]["rawSql"])
            assert [c[0] for c in cursor.description] == ["subject", "severity", "firing"]
            found[rule["labels"]["kind"]] = cursor.fetchall()
    assert found == {
        "schedule_missed": [],
        "job_overdue": [],
        "queue_age": [("reports", "critical", 1)],
        "queue_no_worker": [("reports", "critical", 1)],
        "attempts_exhausted": [],
    }


def test_the_documented_read_only_role_reads_the_view(now: datetime) -> None:
    from django.db.utils import ProgrammingError

    JobFactory(queue="reports", run_after=now - timedelta(minutes=25))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        if not cursor.fetchone()[0]:
            pytest.skip("the test database user may not create roles")
        cursor.execute("SELECT current_database()")
        database = cursor.fetchone()[0]
    role = f"grafana_alerts_test_{connection.connection.info.backend_pid}"
    setup = read_only_role_sql().replace("grafana_jobs", role)
    with connection.cursor() as cursor:
        cursor.execute(setup.replace("DATABASE app", f'DATABASE "{database}"'))
        cursor.execute(f"SET ROLE {role}")
        try:
            cursor.execute("SELECT kind, subject FROM django_jobs_alerts ORDER BY kind")
            assert cursor.fetchall() == [("queue_age", "reports"), ("queue_no_worker", "reports")]
            cursor.execute("SAVEPOINT denied")
            with pytest.raises(ProgrammingError, match="permission denied"):
                cursor.execute("SELECT 1 FROM django_jobs_alert_threshold")
            cursor.execute("ROLLBACK TO SAVEPOINT denied")
        finally:
            cursor.execute("RESET ROLE")


# ------------------------------------------------------------------------------------- cost


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_view_reads_indexes_only_at_a_large_table() -> None:
    with connection.cursor() as cursor:
        fill_history(cursor, finished=200_000, pending=5_000, waiting=1_000)
        for table in ("django_jobs_job", "django_jobs_attempt"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("EXPLAIN SELECT * FROM django_jobs_alerts")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    for table in ("django_jobs_job", "django_jobs_attempt"):
        assert not re.search(rf"Seq Scan on {table}\b", plan), plan
    for index in (
        "job_claim_free_queue_idx",
        "job_admin_task_idx",
        "attempt_failed_idx",
        "schedule_tick_once",
        "alert_threshold_once",
    ):
        assert index in plan, f"no {index}:\n{plan}"
    assert re.search(r"job_running_worker_idx|job_admin_state_idx", plan), plan
    print(plan)
