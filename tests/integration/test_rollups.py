"""Hourly rollups (django_jobs/rollups.py): exact counts, each hour once, and history that
outlives ``prunejobs``."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_jobs import rollups
from django_jobs.models import Job, Rollup, RollupState, RollupTotal
from django_jobs.prune import prune
from tests.conftest import connect
from tests.factories import AttemptFactory, JobFactory
from tests.timing import BUSY_MACHINE_MARGIN, LOCK_WAIT_MS

BOUNDS = rollups.DURATION_BOUNDS


def hour_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def finished(
    at: datetime,
    *,
    state: str = "done",
    task: str = "tests.noop",
    queue: str = "default",
    seconds: float = 1.0,
    waited: float = 0.0,
    failed_first: float | None = None,
) -> Job:
    """A job that ended ``state`` at ``at`` after a final attempt of ``seconds`` that started
    ``waited`` seconds after it was ready; with ``failed_first``, an earlier attempt of that
    many seconds that failed, ending when the final one started."""
    started = at - timedelta(seconds=seconds)
    job = JobFactory(
        finished=True,
        state=state,
        task=task,
        queue=queue,
        run_after=started - timedelta(seconds=waited),
        started_at=started,
        finished_at=at,
        attempt=2 if failed_first is not None else 1,
    )
    number = 1
    if failed_first is not None:
        AttemptFactory(
            job=job,
            number=1,
            outcome="error",
            started_at=started - timedelta(seconds=failed_first),
            finished_at=started,
        )
        number = 2
    AttemptFactory(
        job=job,
        number=number,
        outcome="done" if state == "done" else "error",
        started_at=started,
        finished_at=at,
    )
    return job


def bucket(seconds: float) -> list[int]:
    counts = [0] * (len(BOUNDS) + 1)
    counts[sum(1 for bound in BOUNDS if bound < seconds)] += 1
    return counts


def rows() -> dict[tuple[datetime, str, str, str], Rollup]:
    return {(r.hour, r.queue, r.task, r.outcome): r for r in Rollup.objects.all()}


@pytest.mark.django_db
def test_an_hour_is_counted_exactly_by_outcome_duration_attempts_and_wait() -> None:
    now = timezone.now()
    three_ago = hour_of(now) - timedelta(hours=3) + timedelta(minutes=10)
    two_ago = hour_of(now) - timedelta(hours=2) + timedelta(minutes=20)
    finished(three_ago, seconds=0.05, waited=2)
    finished(three_ago + timedelta(minutes=1), seconds=3.0, waited=4)
    finished(two_ago, state="error", seconds=40.0, failed_first=7.0, waited=1)
    finished(two_ago, queue="reports", task="tests.report", seconds=4000.0)
    JobFactory(claimed=True)  # running: nothing to count
    recent = finished(now - timedelta(seconds=1))  # its hour is not closed: not yet

    result = rollups.roll_up()

    assert result.passes == 1 and result.rows == 3
    assert result.rolled_until == hour_of(now - rollups.ROLLUP_DELAY)
    got = rows()
    done = got[(hour_of(three_ago), "default", "tests.noop", "done")]
    assert (done.jobs, done.attempts) == (2, 2)
    assert done.duration_seconds_total == pytest.approx(3.05)
    assert done.duration_seconds_max == pytest.approx(3.0)
    assert done.duration_buckets == rollups.add_buckets(bucket(0.05), bucket(3.0))
    assert (done.waited_jobs, done.wait_seconds_total, done.wait_seconds_max) == (
        2,
        pytest.approx(6.0),
        pytest.approx(4.0),
    )
    error = got[(hour_of(two_ago), "default", "tests.noop", "error")]
    # The job ended in error after two failed attempts: both attempts are in the error row.
    assert (error.jobs, error.attempts) == (1, 2)
    assert error.duration_seconds_total == pytest.approx(47.0)
    assert error.duration_buckets == rollups.add_buckets(bucket(7.0), bucket(40.0))
    assert error.wait_seconds_total == pytest.approx(1.0)
    report = got[(hour_of(two_ago), "reports", "tests.report", "done")]
    assert report.duration_buckets == bucket(4000.0)
    assert len(got) == 3  # the recent job's hour is still open

    totals = {(t.queue, t.task, t.outcome): t for t in RollupTotal.objects.all()}
    assert sorted(totals) == [
        ("default", "tests.noop", "done"),
        ("default", "tests.noop", "error"),
        ("reports", "tests.report", "done"),
    ]
    assert (totals[("default", "tests.noop", "done")].jobs, recent.state) == (2, "done")


@pytest.mark.django_db
def test_a_second_pass_writes_nothing_and_later_hours_add_to_the_totals() -> None:
    now = timezone.now()
    finished(hour_of(now) - timedelta(hours=5, minutes=-5), seconds=2.0)
    first = rollups.roll_up()
    assert (first.passes, first.rows) == (1, 1)
    again = rollups.roll_up()
    assert (again.passes, again.rows) == (0, 0)
    assert Rollup.objects.count() == 1

    # A job finished in an hour that is already rolled up would be a bug of the clock; one in a
    # later hour is added when that hour closes. Here: move the watermark back by hand.
    RollupState.objects.update(rolled_until=hour_of(now) - timedelta(hours=3))
    finished(hour_of(now) - timedelta(hours=2, minutes=-30), seconds=30.0)
    rollups.roll_up()
    total = RollupTotal.objects.get()
    assert (total.jobs, total.attempts) == (2, 2)
    assert total.duration_seconds_total == pytest.approx(32.0)
    assert total.duration_seconds_max == pytest.approx(30.0)
    assert total.duration_buckets == rollups.add_buckets(bucket(2.0), bucket(30.0))


@pytest.mark.django_db
def test_nothing_finished_means_no_watermark_yet() -> None:
    JobFactory()
    assert rollups.roll_up().rolled_until is None
    assert not RollupState.objects.exists()


@pytest.mark.django_db
def test_a_long_history_is_rolled_up_a_day_per_pass() -> None:
    now = timezone.now()
    for days in (10, 5, 1):
        finished(now - timedelta(days=days))
    seen = []
    result = rollups.roll_up(progress=lambda r: seen.append(r.passes))
    assert result.passes == len(seen) >= 10
    assert Rollup.objects.count() == 3
    assert sum(Rollup.objects.values_list("jobs", flat=True)) == 3


@pytest.mark.django_db
def test_prune_rolls_up_first_so_the_history_outlives_the_jobs() -> None:
    now = timezone.now()
    for days in (30, 20):
        finished(now - timedelta(days=days), seconds=5.0)
        finished(now - timedelta(days=days), state="error", seconds=1.0)
    result = prune(older_than=timedelta(days=14))
    assert result.jobs == 4
    assert not Job.objects.exists()
    assert sum(Rollup.objects.values_list("jobs", flat=True)) == 4
    totals = {t.outcome: t for t in RollupTotal.objects.all()}
    assert (totals["done"].jobs, totals["error"].jobs) == (2, 2)
    # Nothing of the pruned jobs is counted a second time by a later pass.
    rollups.roll_up()
    assert sum(RollupTotal.objects.values_list("jobs", flat=True)) == 4


@pytest.mark.django_db
def test_prune_never_deletes_a_job_its_rollups_have_not_counted() -> None:
    just_now = finished(timezone.now() - timedelta(seconds=30))
    result = prune(older_than=timedelta(0))
    assert result.jobs == 0
    assert Job.objects.filter(pk=just_now.pk).exists()


@pytest.mark.django_db
def test_prune_deletes_hourly_rows_past_their_retention_and_keeps_the_totals(settings) -> None:
    now = timezone.now()
    finished(now - timedelta(days=40))
    finished(now - timedelta(days=3))
    rollups.roll_up()
    settings.JOBS_ROLLUP_RETENTION = "30d"
    prune(older_than=timedelta(days=365))
    assert Rollup.objects.count() == 1
    assert RollupTotal.objects.get().jobs == 2


def test_percentiles_interpolate_within_their_bucket() -> None:
    counts = rollups.add_buckets(bucket(0.05), bucket(3.0))
    assert rollups.percentile(counts, 0.5) == pytest.approx(0.1)
    assert rollups.percentile([0] * (len(BOUNDS) + 1), 0.5) is None
    ten = [0] * (len(BOUNDS) + 1)
    ten[BOUNDS.index(10.0)] = 10  # ten durations in [5, 10)
    assert rollups.percentile(ten, 0.5) == pytest.approx(7.5)
    assert rollups.percentile(ten, 0.95) == pytest.approx(9.75)
    last = [0] * len(BOUNDS) + [3]
    assert rollups.percentile(last, 0.99) == BOUNDS[-1]


@pytest.mark.django_db
def test_rollupjobs_command_reports() -> None:
    finished(timezone.now() - timedelta(days=2))
    out = StringIO()
    call_command("rollupjobs", stdout=out)
    assert "rolled up until" in out.getvalue() and "1 hourly row(s)" in out.getvalue()


def _race(barrier, results) -> None:  # pragma: no cover - runs in a child process
    barrier.wait()
    result = rollups.roll_up()
    results.put((result.passes, result.rows, result.lost_races))
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_three_processes_at_once_write_each_hour_once() -> None:
    now = timezone.now()
    for hours in range(2, 60, 3):
        finished(now - timedelta(hours=hours))
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(3), context.Queue()
    connection.close()  # children must not share this process' connection
    processes = [context.Process(target=_race, args=(barrier, results)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    outcomes = [results.get(timeout=5) for _ in processes]
    assert sum(rows for _, rows, _ in outcomes) == 20
    assert Rollup.objects.count() == 20
    assert sum(RollupTotal.objects.values_list("jobs", flat=True)) == 20


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_finds_another_under_way_writes_nothing_and_does_not_wait(settings) -> None:
    import time

    settings.JOBS_LOCK_TIMEOUT_MS = LOCK_WAIT_MS  # a wait for the lock would take 30 s
    finished(timezone.now() - timedelta(hours=30))
    assert rollups.roll_up().passes == 2  # the watermark row exists from here on
    # As if the last hours were still to roll up, with a job finished in them.
    RollupState.objects.update(rolled_until=hour_of(timezone.now()) - timedelta(hours=5))
    finished(timezone.now() - timedelta(hours=3))
    with connect() as other:
        other.execute("BEGIN")
        other.execute("SELECT 1 FROM django_jobs_rollup_state WHERE id = 1 FOR UPDATE")
        started = time.monotonic()
        result = rollups.roll_up()
        waited = time.monotonic() - started
        other.execute("ROLLBACK")
    assert (result.passes, result.lost_races, Rollup.objects.count()) == (0, 1, 1)
    assert waited < BUSY_MACHINE_MARGIN  # a statement or two, not the 30 s lock timeout
    assert rollups.roll_up().rows == 1


@pytest.mark.django_db
def test_the_documented_query_reads_the_rollups() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    (sql,) = [
        block
        for block in re.findall(r"^```sql\n(.*?)^```", text, re.M | re.S)
        if "FROM django_jobs_rollups\n" in block
    ]
    now = timezone.now()
    finished(now - timedelta(days=2), seconds=2.0)
    finished(now - timedelta(days=2), seconds=4.0)
    finished(now - timedelta(days=3), state="error")
    finished(now - timedelta(days=30), state="error")  # before the 7 days
    rollups.roll_up()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        assert cursor.fetchall() == [("tests.noop", pytest.approx(1 / 3), pytest.approx(3.0))]


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("JOBS_ROLLUP_RETENTION", "a year", "expected a duration"),
        ("JOBS_ROLLUP_RETENTION", -5, "cannot be negative"),
        ("JOBS_ROLLUP_INTERVAL", -1, "from 1 to 86400"),
        ("JOBS_ROLLUP_INTERVAL", "often", "or 0 to turn"),
        ("JOBS_ROLLUP_INTERVAL", 1e-9, "from 1 to 86400"),
        ("JOBS_ROLLUP_INTERVAL", True, "from 1 to 86400"),
        ("JOBS_ROLLUP_RETENTION", 400, "a bare number is seconds"),
        ("JOBS_ROLLUP_RETENTION", "100000000d", "to 100 years"),
    ],
)
def test_bad_rollup_settings_are_system_check_errors(settings, setting, value, message) -> None:
    from django_jobs.checks import check_rollups

    setattr(settings, setting, value)
    (error,) = check_rollups()
    assert error.id == "django_jobs.E008" and message in error.msg and setting in error.msg


def test_good_rollup_settings_pass_the_check(settings) -> None:
    from django_jobs.checks import check_rollups

    settings.JOBS_ROLLUP_RETENTION, settings.JOBS_ROLLUP_INTERVAL = "12w", 0
    assert check_rollups() == []


@pytest.mark.django_db
def test_a_duration_on_a_bound_is_in_that_bounds_bucket_as_prometheus_le_counts() -> None:
    at = timezone.now() - timedelta(days=1)
    for seconds in (1.0, 2.5, 0.1):
        finished(at, seconds=seconds)
    rollups.roll_up()
    (row,) = Rollup.objects.filter(outcome="done")
    expected = [0] * (len(BOUNDS) + 1)
    for bound in (1.0, 2.5, 0.1):
        expected[BOUNDS.index(bound)] += 1
    assert row.duration_buckets == expected


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_runs_into_the_statement_timeout_is_done_again_in_smaller_passes() -> None:
    from unittest import mock

    from django_jobs.store import rollups as statements

    for days in (3, 2, 1):
        finished(timezone.now() - timedelta(days=days))
    real = statements.roll_up
    spans = []

    def slow_when_long(cursor, start, end, bounds):
        spans.append(end - start if start else None)
        if start is not None and end - start > timedelta(hours=6):
            cursor.execute("SET LOCAL statement_timeout = 1; SELECT pg_sleep(0.1)")
        return real(cursor, start, end, bounds)

    with mock.patch.object(statements, "roll_up", slow_when_long):
        result = rollups.roll_up()
    assert sum(Rollup.objects.values_list("jobs", flat=True)) == 3
    assert result.rolled_until is not None
    hours = [span // timedelta(hours=1) for span in spans[1:]]
    assert hours[:3] == [24, 12, 6] and max(hours[3:]) <= 6, hours


@pytest.mark.django_db(transaction=True)
def test_without_time_zones_rollups_and_prune_still_work() -> None:
    from django.test import override_settings

    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Kolkata"):
        connection.close()
        from datetime import datetime as naive

        with connection.cursor() as cursor:
            cursor.execute("SELECT now() - interval '2 days'")
            (two_days_ago,) = cursor.fetchone()
        assert two_days_ago.tzinfo is None
        JobFactory(
            finished=True, started_at=two_days_ago, finished_at=two_days_ago,
            run_after=two_days_ago,
        )  # fmt: skip
        result = prune(older_than=timedelta(days=1))
        assert result.jobs == 1
        assert isinstance(RollupState.objects.get().rolled_until, naive)
        assert rollups.roll_up().passes == 0
        assert [t.jobs for t in rollups.task_statistics()] == [1]
    connection.close()
    assert RollupTotal.objects.get().jobs == 1


def test_no_model_field_needs_django_contrib_postgres_installed() -> None:
    # Django 6 refuses ArrayField unless django.contrib.postgres is in INSTALLED_APPS
    # (postgres.E005); a project that installs django-jobs need not add it.
    from django.apps import apps

    for model in apps.get_app_config("django_jobs").get_models():
        for field in model._meta.get_fields():
            assert not type(field).__module__.startswith("django.contrib.postgres"), (
                f"{model.__name__}.{field.name}"
            )
    assert not apps.is_installed("django.contrib.postgres"), "the test project must not need it"


def test_the_dashboards_chart_counts_attempts_per_hour_from_the_rollups_and_any_range_is_safe(
    admin_client,
) -> None:
    from tests.factories import AttemptFactory, JobFactory

    at = timezone.now() - timedelta(days=3)
    ended = [("done", "done"), ("done", "done"), ("error", "error"), ("error", "timeout"),
             ("error", "lost"), ("cancelled", "cancelled")]  # fmt: skip
    for state, outcome in ended:
        job = JobFactory(finished=True, state=state, finished_at=at)
        AttemptFactory(job=job, outcome=outcome, started_at=at, finished_at=at)
    rollups.roll_up()
    Job.objects.all().delete()  # pruned: the chart reads the rollups
    week = admin_client.get("/admin/django_jobs/dashboard/?range=7d").content.decode()
    assert "attempts per hour" in week
    assert ": 2 done, 3 failed</title>" in week  # a cancelled attempt did not fail
    day = admin_client.get("/admin/django_jobs/dashboard/").content.decode()
    assert "attempts per hour" in day and ": 2 done, 3 failed</title>" not in day
    for bad in ("2y", "", "%00", "7d'--"):
        response = admin_client.get("/admin/django_jobs/dashboard/", {"range": bad})
        html = response.content.decode()
        assert response.status_code == 200 and 'aria-current="page">24 h<' in html
    hour = admin_client.get("/admin/django_jobs/dashboard/?range=1h").content.decode()
    assert "attempts per minute" in hour
